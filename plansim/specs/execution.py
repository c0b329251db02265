"""ExecutionSpec: the training framework a plan runs on and the implementation facts of that
framework and version that change the cost of the same layout (pure).

The same DP x TP x PP layout costs different times under Megatron-LM of 2021 (unfused
attention, a separate gradient-accumulation pass, a two-pass layer-norm backward) and under
Megatron-Core of 2025; these are not layout choices but properties of the software, so they
live here, beside the framework's name, and not among the parallel degrees.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import SpecError, require_flags
from plansim.specs.choice_enum import ChoiceEnum, require_members


class Framework(ChoiceEnum):
    """The training framework that runs a plan.

    MEGATRON_CORE: NVIDIA Megatron-LM on Megatron-Core (2023-), and the frameworks built on
    it (NeMo, Megatron-Bridge). MEGATRON_LM: Megatron-LM before Megatron-Core (2019-2023).
    MEGATRON_DEEPSPEED: the DeepSpeed-based forks of Megatron-LM (BigScience
    Megatron-DeepSpeed, GPT-NeoX). DEEPSPEED: DeepSpeed's own engine (ZeRO, its pipeline
    engine). TORCHTITAN: PyTorch's torchtitan (FSDP2, DTensor TP, pipelining). COMPOSER:
    MosaicML Composer / llm-foundry (PyTorch FSDP). PYTORCH: plain PyTorch, as ``plansim
    validate`` runs a plan.
    """

    MEGATRON_CORE = "megatron-core"
    MEGATRON_LM = "megatron-lm"
    MEGATRON_DEEPSPEED = "megatron-deepspeed"
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"
    COMPOSER = "composer"
    PYTORCH = "pytorch"


class AttentionKernel(ChoiceEnum):
    """Attention implementation: fused FlashAttention (Dao et al. 2022; priced as a
    FlashAttention-2-class kernel), the Triton FlashAttention of 2022 (``flash-triton``:
    ``flash_attn/flash_attn_triton.py``, which MosaicML's llm-foundry ran as
    ``attn_impl: triton``; fused like FLASH, slower, ``plansim.analytic.op_overheads``), or
    the unfused softmax(QK^T)V that materialises the s x s scores (Megatron-LM before
    FlashAttention)."""

    FLASH = "flash"
    FLASH_TRITON = "flash-triton"
    UNFUSED = "unfused"

    @property
    def fused(self) -> bool:
        """One IO-aware kernel that never writes the s x s scores (FLASH, FLASH_TRITON)."""
        return self is not AttentionKernel.UNFUSED

    @property
    def label(self) -> str:
        """The plan label's part for this kernel ('' for the default FLASH)."""
        return {
            AttentionKernel.UNFUSED: "unfused-attn",
            AttentionKernel.FLASH_TRITON: "triton-attn",
        }.get(self, "")


class DdpImpl(ChoiceEnum):
    """The data-parallel wrapper whose once-per-step gradient average the optimizer segment
    carries (``plansim.analytic.elementwise.grad_average_bytes``): Megatron-core's
    ``DistributedDataParallel`` (scales each gradient bucket by 1 / dp before its collective
    when dp * cp > 1), Megatron-LM's legacy ``--DDP-impl local`` (2020-2023: divides its whole
    gradient buffer by dp every step, also at dp 1), or PyTorch DDP (``--DDP-impl torch``:
    copies each gradient into its bucket, divided on the way, and back after the
    all-reduce), or a collective that averages itself (``ReduceOp.AVG``: Megatron-core's
    ``--ddp-average-in-collective``, the validate runner's flat all-reduce): no pass."""

    MEGATRON_CORE = "megatron-core"
    LOCAL = "local"
    TORCH = "torch"
    AVERAGE_IN_COLLECTIVE = "average-in-collective"


class MoeTokenDispatcher(ChoiceEnum):
    """How a MoE layer sends tokens to the ranks of their experts and back.

    ALLTOALL: Megatron-Core's ``--moe-token-dispatcher-type alltoall``: every (token,
    expert) pair is its own row of an NCCL all-to-all over the EP group, so a token with k
    experts on other nodes crosses the network k times. DEEPEP: DeepEP's internode kernels
    (Megatron-Core ``--moe-token-dispatcher-type flex --moe-enable-deepep``; the
    communication of DeepSeek-V3's own training, arXiv 2412.19437 §3.2.2): a token crosses
    the network once per destination node, to the GPU of the same in-node index, which
    forwards it over NVLink to each of its experts there; with fp8 training the dispatch
    moves fp8 activations (§3.3.2, "Low-Precision Communication"; the combine stays bf16).
    """

    ALLTOALL = "alltoall"
    DEEPEP = "deepep"


_FLAG_FIELDS = (
    "gradient_accumulation_fusion",
    "fused_elementwise",
    "persist_layer_norm",
    "scatter_gather_p2p",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionSpec:
    """The framework and version a plan runs on, with the implementation facts it costs.

    Attributes:
        framework: the training framework (:class:`Framework`); the default target of
            ``plansim export``.
        framework_version: the framework's release or commit as the user names it (e.g.
            ``"core_r0.13.0"``, ``"0.3.16"``), or None; recorded with the plan.
        attention: attention kernel (FlashAttention drops the s x s activations and traffic).
        gradient_accumulation_fusion: weight-gradient GEMMs accumulate straight into the
            gradient buffer (Megatron-LM ``--gradient-accumulation-fusion``, default on since
            2022); off, every micro-batch adds its fresh weight gradients into the buffer with
            a separate memory-bound pass (Megatron-LM 2021's ``main_grad.add_``, PyTorch
            autograd accumulation).
        fused_elementwise: the layer's memory-bound work runs as Megatron-LM's fused kernels
            (one per norm, RoPE, activation: ``plansim.analytic.elementwise``); off, as the
            eager PyTorch ops of Meta's reference Llama code (torchtitan 2024 without
            ``torch.compile``: RMSNorm in eight ops, RoPE on complex numbers, ``repeat_kv``
            copies, SwiGLU as silu and mul), which move more bytes and launch more kernels
            (``plansim.analytic.eager_elementwise``).
        persist_layer_norm: a layer norm's backward computes the input gradient and the
            weight (and bias) gradients in one pass over dy and x, as Megatron-LM's
            persistent layer norm does (apex ``FastLayerNormFN``; ``--no-persist-layer-norm``
            turns it off, and Megatron-LM turns it off itself before PyTorch 1.11, the
            version the kernel needs, so its 2021 runs used the other). Off, the backward is
            two passes (Megatron-LM's ``fused_mix_prec_layer_norm_cuda``, apex's
            ``FusedLayerNorm``: a weight-and-bias-gradient kernel, then the input-gradient
            kernel, each reading dy and x): 4 more bytes per element per norm
            (``plansim.analytic.elementwise``). Eager PyTorch's LayerNorm is two passes
            whatever this says (``plansim.analytic.eager_elementwise``).
        scatter_gather_p2p: without sequence parallelism, each of the tp ranks sends only
            its 1/tp slice of the b*s*h pipeline tensor and the receiving stage re-forms it
            with an all-gather over its TP group (Megatron-LM
            ``--scatter-gather-tensors-in-pipeline``, default on; Narayanan et al. SC21
            §4.1). Off, every TP rank sends the whole tensor (Megatron-LM 2020: its
            ``communicate`` sends (seq, mbs, hidden) from every rank). With sequence
            parallelism the tensor is already split over the TP ranks: no effect.
        ddp_impl: the data-parallel wrapper of ZeRO-0/1 gradients (:class:`DdpImpl`), which
            sets the once-per-step gradient-average passes over the rank's gradient buffer
            that the optimizer segment carries (``elementwise.grad_average_bytes``):
            Megatron-core (default) scales the buffer when dp * cp > 1, Megatron-LM's
            legacy local DDP divides it every step, PyTorch DDP copies it into its buckets
            and back. No effect with ZeRO-2/3 (their reduce-scatter path has its own) or a
            parameter server.
        moe_token_dispatcher_type: the MoE token dispatcher (:class:`MoeTokenDispatcher`);
            no effect on a dense model or inside one node.

    The defaults are Megatron-Core's of 2024-2026.

    Raises:
        SpecError: an enum field not a member of its enum, a flag not a boolean, or
            framework_version neither None nor a non-empty string.
    """

    framework: Framework = Framework.MEGATRON_CORE
    framework_version: str | None = None
    attention: AttentionKernel = AttentionKernel.FLASH
    gradient_accumulation_fusion: bool = True
    fused_elementwise: bool = True
    persist_layer_norm: bool = True
    scatter_gather_p2p: bool = True
    ddp_impl: DdpImpl = DdpImpl.MEGATRON_CORE
    moe_token_dispatcher_type: MoeTokenDispatcher = MoeTokenDispatcher.ALLTOALL

    def __post_init__(self) -> None:
        require_members(
            ("framework", "attention", "ddp_impl", "moe_token_dispatcher_type"),
            (self.framework, self.attention, self.ddp_impl, self.moe_token_dispatcher_type),
            (Framework, AttentionKernel, DdpImpl, MoeTokenDispatcher),
        )
        require_flags(
            _FLAG_FIELDS,
            (
                self.gradient_accumulation_fusion,
                self.fused_elementwise,
                self.persist_layer_norm,
                self.scatter_gather_p2p,
            ),
            prefix="plan.",
        )
        version = self.framework_version
        if version is not None and (type(version) is not str or not version.strip()):
            raise SpecError(
                f"plan.framework_version must be a non-empty string or unset, got {version!r}"
            )
