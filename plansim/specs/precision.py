"""MixedPrecisionOptions: the matmul precision, the gradient-reduction dtype and the layers
kept in bf16 under fp8 / fp4 (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import SpecError, choice_error
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


#: Precisions that keep an fp32 main-gradient buffer, which bf16 reduction replaces.
_FP32_GRAD_BUFFER = (Precision.BF16, Precision.FP8, Precision.FP4)
_QUANTIZED = (Precision.FP8, Precision.FP4)


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedPrecisionOptions:
    """Numerics of a plan.

    Attributes:
        precision: matmul precision (:class:`Precision`; Megatron-LM ``--bf16`` /
            ``--fp16`` / ``--fp8-format`` / ``--fp4-format``).
        grad_reduce_in_bf16: gradients accumulate and are reduced over data parallelism in
            bf16, 2 bytes per parameter, instead of Megatron's fp32 main-gradient buffer
            (Megatron-LM ``--grad-reduce-in-bf16``, ``DistributedDataParallelConfig
            (grad_reduce_in_fp32=False)``; NeMo 2's fp8 recipe ``bf16_with_fp8_mixed`` sets it,
            "NVIDIA recommends False for FP8"): halves the gradient memory and the DP
            reduce-scatter / all-reduce bytes. Needs precision bf16, fp8 or fp4 (fp16
            gradients are 16-bit already, fp32 training has no 16-bit gradients).
        num_layers_at_start_in_bf16, num_layers_at_end_in_bf16: with precision fp8 or fp4,
            the first / last transformer layers of the model that run in bf16 (Megatron-LM
            ``--first-last-layers-bf16`` with ``--num-layers-at-start-in-bf16`` /
            ``--num-layers-at-end-in-bf16``, Megatron-core ``is_first_last_bf16_layer``):
            their GEMMs run at the 16-bit rate without Transformer Engine's casts and keep
            16-bit GEMM inputs for the backward. Megatron-Bridge's FP8 current-scaling
            preset (``bf16_with_fp8_current_scaling_mixed``) keeps 1 and 1, its Llama 3 8B
            NVFP4 recipe 0 and 4. 0 and 0 (default): every layer quantized.

    Raises:
        SpecError: precision not a :class:`Precision`, grad_reduce_in_bf16 not a boolean or
            set with fp16 / fp32, bf16 layer counts not integers >= 0 or non-zero without
            fp8 / fp4.
    """

    precision: Precision = Precision.BF16
    grad_reduce_in_bf16: bool = False
    num_layers_at_start_in_bf16: int = 0
    num_layers_at_end_in_bf16: int = 0

    def __post_init__(self) -> None:
        if type(self.precision) is not Precision:
            raise choice_error("plan.precision", self.precision, [m.value for m in Precision])
        if type(self.grad_reduce_in_bf16) is not bool:
            raise choice_error("plan.grad_reduce_in_bf16", self.grad_reduce_in_bf16, [True, False])
        if self.grad_reduce_in_bf16 and self.precision not in _FP32_GRAD_BUFFER:
            raise SpecError(
                f"plan.grad_reduce_in_bf16 needs precision "
                f"{', '.join(p.value for p in _FP32_GRAD_BUFFER)} (got {self.precision.value}: "
                "its gradients are not kept in an fp32 buffer)"
            )
        self._check_bf16_layers()

    def _check_bf16_layers(self) -> None:
        """num_layers_at_start/end_in_bf16: integers >= 0, non-zero only with a quantized
        precision (Megatron-LM keeps layers in bf16 only out of fp8 or fp4 training)."""
        start, end = self.num_layers_at_start_in_bf16, self.num_layers_at_end_in_bf16
        if type(start) is int and type(end) is int and start == end == 0:
            return  # the common case, checked fast
        for field, value in (
            ("num_layers_at_start_in_bf16", start),
            ("num_layers_at_end_in_bf16", end),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"plan.{field} must be an integer >= 0, got {value!r}")
        if (start or end) and self.precision not in _QUANTIZED:
            raise SpecError(
                f"plan.num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16 "
                f"({start} / {end}) need "
                f"precision fp8 or fp4 (got {self.precision.value}): the other layers must be "
                f"quantized for some to stay in bf16"
            )
