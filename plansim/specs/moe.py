"""MoESpec: the routed experts of a Mixture-of-Experts transformer (a ``ModelSpec.moe``).

A MoE layer replaces the dense MLP by ``num_experts`` expert MLPs of width
``expert_ffn_hidden_size``, of which a router picks ``router.top_k`` per token, plus
``num_shared_experts`` experts every token runs (DeepSeekMoE, Dai et al. 2024,
arXiv:2401.06066 §3; DeepSeek-V3 report arXiv:2412.19437 §2.1.2). Which layers have experts:
the first ``first_k_dense_layers`` are dense (DeepSeek's ``first_k_dense_replace``), then every
``layer_interval``-th layer (Llama 4 Maverick interleaves dense and MoE layers:
``interleave_moe_layer_step`` 2).

Field names follow the Hugging Face configs and Megatron-LM's arguments: ``num_experts``
(Megatron ``--num-experts``; HF ``num_local_experts`` / ``n_routed_experts`` /
``num_experts``), ``expert_ffn_hidden_size`` (``--moe-ffn-hidden-size``; HF
``moe_intermediate_size``), ``router.top_k`` (``--moe-router-topk``; HF
``num_experts_per_tok``), ``router.score`` (``--moe-router-score-function``; DeepSeek
``scoring_func``), ``router.num_groups`` / ``router.groups_per_token`` (``--moe-router-num-groups``
/ ``--moe-router-group-topk``; DeepSeek ``n_group`` / ``topk_group``).

Pure data: parameter and FLOP counts are in :mod:`plansim.analytic.moe_counts`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plansim.errors import SpecError, choice_error, require_positive_int
from plansim.specs.choice_enum import ChoiceEnum

__all__ = ["ExpertCapacity", "MoESpec", "RouterScore", "RouterSpec"]


class RouterScore(ChoiceEnum):
    """How the router turns its logits (one per routed expert) into gate weights.

    SOFTMAX: softmax gating (GShard, Switch; Mixtral arXiv:2401.04088 Eq. 2 applies it to the
    top-k logits, Qwen2/3-MoE and DeepSeek-V2 to all logits before the top-k; the same
    parameters and FLOPs either way). SIGMOID: a sigmoid per expert (DeepSeek-V3 report §2.1.2
    Eq. 13-15, normalised over the chosen k; Llama 4).
    """

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class ExpertCapacity(ChoiceEnum):
    """What an expert does with more tokens than its share.

    DROPLESS: every routed token is computed (MegaBlocks, Gale et al. 2023; Megatron-Core's
    default; the Megatron-Bridge benchmarks of ``reference/moe_runs.csv`` are "token-dropless").
    CAPACITY_FACTOR: each expert takes at most capacity_factor x tokens x top_k / num_experts
    tokens per batch and drops the rest (GShard, Lepikhin et al. 2020 §2.2; Switch
    Transformer, Fedus et al. 2021 §2.2; Megatron ``--moe-expert-capacity-factor``).
    """

    DROPLESS = "dropless"
    CAPACITY_FACTOR = "capacity-factor"


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterSpec:
    """The token router (gate) of a MoE layer: a linear h -> num_experts and a top-k.

    Attributes:
        score: softmax or sigmoid gating.
        top_k: routed experts per token (Mixtral 2, DeepSeek-V3 8, Llama 4 1).
        bias: the router carries one parameter per expert besides its h x E weight:
            DeepSeek-V3's ``e_score_correction_bias`` (auxiliary-loss-free balancing, report
            §2.1.2, used for the choice only) or gpt-oss's linear bias.
        num_groups: the routed experts form this many groups (1: no group limit);
            DeepSeek-V3 8 (one per node of its EP64 layout, report §2.1.2 "node-limited
            routing").
        groups_per_token: a token's top_k experts come from at most this many groups
            (DeepSeek-V3 4, "M = 4").

    Raises:
        SpecError: a count is not a positive integer, the score is not a RouterScore, the
            bias is not a bool, or groups_per_token exceeds num_groups.
    """

    score: RouterScore
    top_k: int
    bias: bool = False
    num_groups: int = 1
    groups_per_token: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.score, RouterScore):
            raise choice_error("moe.router.score", self.score, [s.value for s in RouterScore])
        for name in ("top_k", "num_groups", "groups_per_token"):
            require_positive_int(f"moe.router.{name}", getattr(self, name))
        if not isinstance(self.bias, bool):
            raise choice_error("moe.router.bias", self.bias, [True, False])
        if self.groups_per_token > self.num_groups:
            raise SpecError(
                f"moe.router.groups_per_token({self.groups_per_token}) exceeds "
                f"moe.router.num_groups({self.num_groups})"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """The experts of a MoE transformer; the model's ``ffn_hidden_size`` sizes its dense layers.

    Attributes:
        num_experts: routed experts per MoE layer E (Mixtral 8, DeepSeek-V3 256).
        expert_ffn_hidden_size: MLP width of one routed expert (DeepSeek-V3 2048; Mixtral
            14336, its dense-equivalent width).
        router: gating function, top-k and group limit.
        num_shared_experts: experts every token runs besides its top_k (DeepSeek-V3 1, Qwen2-MoE
            1, Llama 4 1, Mixtral 0).
        shared_expert_ffn_hidden_size: MLP width of one shared expert; None: the routed
            experts' width (DeepSeek, Llama 4). Qwen2-MoE's one shared expert is wider
            (``shared_expert_intermediate_size`` 20480 for Qwen2-57B-A14B against 2560).
            Megatron's ``--moe-shared-expert-intermediate-size`` is the sum over the shared
            experts, num_shared_experts x this.
        shared_expert_gate: a sigmoid gate scales the shared experts' output, one h -> 1
            linear (Qwen2-MoE ``shared_expert_gate``; Megatron ``--moe-shared-expert-gate``).
        first_k_dense_layers: leading layers with a dense MLP instead (DeepSeek-V3 3,
            ``first_k_dense_replace``).
        layer_interval: after those, every layer_interval-th layer has experts, the last of
            each interval (1: all; Llama 4 Maverick 2: layers 1, 3, ..., 47 counted from 0, as
            Hugging Face ``Llama4TextConfig.moe_layers`` and Qwen's ``decoder_sparse_step``
            count them). The other layers are dense.
        capacity: dropless, or capped at ``capacity_factor``.
        capacity_factor: with CAPACITY_FACTOR, the cap as a multiple of an even share; None
            when DROPLESS.

    Raises:
        SpecError: a count is not a positive (or, for the shared experts and dense layers,
            non-negative) integer, top_k exceeds the experts, the groups do not split the
            experts or cannot supply top_k of them, a shared-expert field is set without
            shared experts, or the capacity fields disagree.
    """

    num_experts: int
    expert_ffn_hidden_size: int
    router: RouterSpec
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int | None = None
    shared_expert_gate: bool = False
    first_k_dense_layers: int = 0
    layer_interval: int = 1
    capacity: ExpertCapacity = ExpertCapacity.DROPLESS
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        for name in ("num_experts", "expert_ffn_hidden_size", "layer_interval"):
            require_positive_int(f"moe.{name}", getattr(self, name))
        for name in ("num_shared_experts", "first_k_dense_layers"):
            _require_count(f"moe.{name}", getattr(self, name))
        if not isinstance(self.router, RouterSpec):
            raise SpecError(f"moe.router must be a RouterSpec, got {self.router!r}")
        self._check_routing()
        self._check_shared()
        self._check_capacity()

    def _check_routing(self) -> None:
        top_k, experts, groups = self.router.top_k, self.num_experts, self.router.num_groups
        if top_k > experts:
            raise SpecError(f"moe.router.top_k({top_k}) exceeds moe.num_experts({experts})")
        if experts % groups:
            raise SpecError(
                f"moe.num_experts({experts}) is not divisible by moe.router.num_groups({groups})"
            )
        reachable = self.router.groups_per_token * (experts // groups)
        if top_k > reachable:
            raise SpecError(
                f"moe.router.top_k({top_k}) exceeds the {reachable} experts of "
                f"moe.router.groups_per_token({self.router.groups_per_token}) groups of "
                f"{experts // groups}"
            )

    def _check_shared(self) -> None:
        width = self.shared_expert_ffn_hidden_size
        if width is not None:
            require_positive_int("moe.shared_expert_ffn_hidden_size", width)
        if not isinstance(self.shared_expert_gate, bool):
            raise choice_error("moe.shared_expert_gate", self.shared_expert_gate, [True, False])
        if self.num_shared_experts == 0 and (width is not None or self.shared_expert_gate):
            raise SpecError(
                f"moe.shared_expert_ffn_hidden_size({width}) / moe.shared_expert_gate"
                f"({self.shared_expert_gate}) describe shared experts, and "
                f"moe.num_shared_experts is 0"
            )

    def _check_capacity(self) -> None:
        if not isinstance(self.capacity, ExpertCapacity):
            raise choice_error("moe.capacity", self.capacity, [c.value for c in ExpertCapacity])
        factor = self.capacity_factor
        if self.capacity is ExpertCapacity.DROPLESS:
            if factor is not None:
                raise SpecError(
                    f"moe.capacity_factor({factor}) needs moe.capacity "
                    f"{ExpertCapacity.CAPACITY_FACTOR.value!r}; a dropless layer has no cap"
                )
            return
        number = isinstance(factor, int | float) and not isinstance(factor, bool)
        if not number or factor is None or not math.isfinite(factor) or factor <= 0:
            raise SpecError(
                f"moe.capacity {self.capacity.value!r} needs a finite moe.capacity_factor > 0, "
                f"got {factor!r}"
            )

    @property
    def top_k(self) -> int:
        """Routed experts per token (``router.top_k``)."""
        return self.router.top_k

    @property
    def shared_ffn_hidden_size(self) -> int:
        """MLP width of one shared expert (the routed experts' unless set)."""
        width = self.shared_expert_ffn_hidden_size
        return self.expert_ffn_hidden_size if width is None else width

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0 = first) has experts: past the leading dense layers,
        the last layer of every ``layer_interval``."""
        past = index - self.first_k_dense_layers
        return past >= 0 and (past + 1) % self.layer_interval == 0

    def num_moe_layers(self, num_layers: int) -> int:
        """MoE layers among ``num_layers``: (L - first_k_dense_layers) // layer_interval."""
        return max(0, num_layers - self.first_k_dense_layers) // self.layer_interval

    def moe_layer_indices(self, num_layers: int) -> tuple[int, ...]:
        """The layers (0 = first) that have experts, in order."""
        return tuple(i for i in range(num_layers) if self.is_moe_layer(i))


def _require_count(field: str, value: object) -> None:
    """Raise SpecError unless value is an int >= 0 (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{field} must be a non-negative integer, got {value!r}")
