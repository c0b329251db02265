"""The enumerated choices of a ParallelPlan (precision, recompute, attention kernel, ZeRO-3
fetch, schedule, DP sync, offload device) and their parser. Re-exported by
``plansim.specs.plan``."""

from __future__ import annotations

import enum

from plansim.errors import choice_error
from plansim.specs.choice_enum import ChoiceEnum


class Precision(ChoiceEnum):
    """Training precision of the matmuls.

    BF16, FP16, FP8, FP4: mixed precision (16-bit working weights and activations, fp32
    master weights for Adam; FP8 and FP4 GEMMs keep bf16 weights and cast their operands).
    FP4 is NVFP4 on Blackwell as Transformer Engine runs it (NVIDIA, "Pretraining Large
    Language Models with NVFP4", arXiv:2509.25149): every linear GEMM in FP4, the attention
    core in bf16 (the paper's few layers kept in bf16 for stability are not modelled).
    FP32: plain single precision, one fp32 copy of every weight, fp32 activations and
    gradients, no master copy (PyTorch's default ``torch.float32`` training, as ``plansim
    validate`` runs on a CPU).
    """

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    FP4 = "fp4"
    FP32 = "fp32"

    @property
    def param_bytes(self) -> int:
        """Bytes of the working copy of a parameter: 2 (FP8 and FP4 keep bf16 weights), 4 for
        FP32."""
        return 4 if self is Precision.FP32 else 2

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element: 16-bit in the mixed modes, 4 for FP32."""
        return 4 if self is Precision.FP32 else 2


class Recompute(ChoiceEnum):
    """Activation recomputation: none; Megatron-LM's selective (the attention core) and full
    (whole layers), Korthikanti et al. 2022 §4-5; torchtitan's per-op selective policy
    (``SELECTIVE_OP``: ``--activation_checkpoint.mode selective`` with
    ``selective_ac_option op``), which saves the outputs of the matmuls and the attention
    kernel except every second matmul of a layer and recomputes everything else
    (``plansim.analytic.flops.op_selective_recompute_gemms``)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    SELECTIVE_OP = "selective-op"


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


class Zero3ParamFetch(ChoiceEnum):
    """How ZeRO-3 gathers parameters (``plansim.analytic.zero3``): one prefetched all-gather
    per layer overlapped with compute (PyTorch FSDP, Zhao et al. VLDB 2023; DeepSpeed since
    2022), one synchronous collective per parameter tensor (DeepSpeed ZeRO-3 in 2021), or one
    collective per layer waited for before the layer runs (FSDP without prefetch: e.g.
    FSDP2 on a CPU device, which has no side streams to run ahead on), or once per step
    (FSDP2 under ``torch.distributed.pipelining``, torchtitan with pp > 1: parameters and
    gradients stay unsharded across the step's micro-batches)."""

    LAYER_PREFETCH = "layer-prefetch"
    PER_TENSOR_SYNC = "per-tensor-sync"
    LAYER_SYNC = "layer-sync"
    PER_STEP = "per-step"


#: The fetch modes that gather one layer (one FSDP unit) at a time per micro-batch, where
#: FSDP's ``reshard_after_forward`` applies.
PER_LAYER_FETCH = (Zero3ParamFetch.LAYER_PREFETCH, Zero3ParamFetch.LAYER_SYNC)


class Schedule(ChoiceEnum):
    """Pipeline schedule; action lists are built by ``plansim.schedule.builders``.

    GPIPE and ONE_F_ONE_B run one model chunk per rank (vpp == 1); INTERLEAVED_1F1B runs
    vpp > 1 chunks per rank (Narayanan et al. SC21 §2.2.2, Megatron-LM virtual pipeline).
    ZB_H1 is the memory-efficient zero-bubble schedule of Qi et al. (ICLR 2024,
    arXiv:2401.10241, §2.1 "ZB-H1"): 1F1B with each backward split into input-gradient (I)
    and weight-gradient (W) actions, W deferred to fill the tail bubble; vpp == 1, pp > 1.
    """

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZB_H1 = "zb-h1"

    @property
    def interleaved(self) -> bool:
        """True when the schedule runs several model chunks (vpp > 1) per rank."""
        return self is Schedule.INTERLEAVED_1F1B


class DpSync(ChoiceEnum):
    """How data-parallel ranks synchronise gradients and weights each step.

    RING: collective all-reduce (ZeRO-0) or reduce-scatter + all-gather (ZeRO-1/2) over the
    dp * cp group (NCCL rings, ``plansim.analytic.comm``). PARAMETER_SERVER: workers push
    gradients to server shards, the servers run the optimizer, workers pull the updated
    weights (Li et al. OSDI 2014; Jiang et al. OSDI 2020 "BytePS";
    ``plansim.analytic.param_server`` gives the traffic and the times).
    """

    RING = "ring"
    PARAMETER_SERVER = "parameter-server"


class OffloadDevice(ChoiceEnum):
    """Where ZeRO offload puts model states (DeepSpeed ``zero_optimization.offload_optimizer``
    / ``offload_param`` ``device``, ``OffloadDeviceEnum``): kept on the GPU, host memory
    (ZeRO-Offload, Ren et al. USENIX ATC 2021) or NVMe (ZeRO-Infinity, Rajbhandari et al.
    SC21)."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


def parse_enum(enum_cls: type[enum.Enum], field: str, value: object) -> enum.Enum:
    """Map a user string (or an enum member) to ``enum_cls``; SpecError names the choices."""
    if isinstance(value, enum_cls):
        return value
    for member in enum_cls:
        if member.value == value:
            return member
    raise choice_error(field, value, [m.value for m in enum_cls])
