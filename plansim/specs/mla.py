"""MlaSpec: Multi-head Latent Attention (DeepSeek-V2 arXiv:2405.04434 §2.1; DeepSeek-V3 report
arXiv:2412.19437 §2.1.1), the ``ModelSpec.mla`` of a model that uses it instead of MHA/GQA.

Keys and values are compressed into one latent of width ``kv_lora_rank`` per token (the only
tensor the KV cache keeps) and expanded per head; queries go through their own low-rank
latent of width ``q_lora_rank``. Each head's query and key split into a ``qk_nope_head_dim``
part without positions and a ``qk_rope_head_dim`` part that carries RoPE (the key's rope part
is one vector shared by all heads); values are ``v_head_dim`` wide. The weights, as
``inference/model.py`` of deepseek-ai/DeepSeek-V3 names them (a = heads, h = hidden):

- ``wq_a`` h x q_lora_rank, ``q_norm`` (RMSNorm, q_lora_rank), ``wq_b`` q_lora_rank x
  a*(qk_nope_head_dim + qk_rope_head_dim); with no query latent (q_lora_rank None,
  DeepSeek-V2-Lite) one ``wq`` h x a*(qk_nope_head_dim + qk_rope_head_dim);
- ``wkv_a`` h x (kv_lora_rank + qk_rope_head_dim), ``kv_norm`` (RMSNorm, kv_lora_rank),
  ``wkv_b`` kv_lora_rank x a*(qk_nope_head_dim + v_head_dim);
- ``wo`` a*v_head_dim x h.

Names as in the Hugging Face DeepSeek-V2/V3 configs and Megatron-LM's ``--q-lora-rank``,
``--kv-lora-rank``, ``--qk-head-dim``, ``--qk-pos-emb-head-dim``, ``--v-head-dim``. Counts are
in :mod:`plansim.analytic.moe_counts`.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import require_positive_int

__all__ = ["MlaSpec"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MlaSpec:
    """Widths of Multi-head Latent Attention (DeepSeek-V3: 1536, 512, 128, 64, 128).

    Attributes:
        q_lora_rank: width of the query latent; None: queries are projected from h directly
            (DeepSeek-V2-Lite; its config says 0 or null).
        kv_lora_rank: width of the joint key/value latent d_c.
        qk_nope_head_dim: per-head query/key width without positions d_h.
        qk_rope_head_dim: per-head query/key width carrying RoPE d_h^R.
        v_head_dim: per-head value width.

    Raises:
        SpecError: a width is not a positive integer (q_lora_rank: or None).
    """

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        if self.q_lora_rank is not None:
            require_positive_int("mla.q_lora_rank", self.q_lora_rank)
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            require_positive_int(f"mla.{name}", getattr(self, name))

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width: qk_nope_head_dim + qk_rope_head_dim (DeepSeek-V3 192)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim
