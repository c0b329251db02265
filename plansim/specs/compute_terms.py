"""Optional compute terms of a hardware profile: fused-attention rate and host per-op cost.

Both are optional in a profile (``hardware_profiles/README.md``); a profile without them
prices attention with its GEMM curve and has no host overhead, exactly as before.

* :class:`AttentionEfficiency`: the rate of a fused attention kernel (FlashAttention, torch
  ``scaled_dot_product_attention``) per dtype, as a fraction of that dtype's matmul peak over
  the FLOPs of one call. Measured by ``plansim calibrate`` (causal SDPA forward, and forward +
  backward); the QK^T and PV products, the softmax and the masking are all inside it.
* :class:`HostOverhead`: the host (CPU) seconds of one eager op in a training step, forward
  (dispatch, autograd recording) and backward (running its autograd node), and whether the
  host runs ahead of the device (GPU: the pass costs max(device, host)) or *is* the device
  (CPU: they add).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from plansim.errors import SpecError

if TYPE_CHECKING:
    from plansim.specs.curves import Curve


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionEfficiency:
    """Fused attention's achievable rate for one dtype, over the FLOPs of one kernel call.

    Both curves share the abscissa: the **forward model FLOPs of one call** over all its
    heads and sequences, causal (the masked half not counted): 4*b*a*s_q*s_k*d / 2 for a
    causal call of b sequences, a heads, s_q queries, s_k keys and head size d, the way
    ``plansim calibrate`` counts its SDPA items.

    Attributes:
        forward: fraction of the dtype's matmul peak the forward reaches at that size
            (forward FLOPs / forward seconds / peak).
        backward: fraction of peak the backward reaches at the same size, its work counted
            as 2 x the forward FLOPs (two GEMMs per forward GEMM; FlashAttention's
            recomputation of the scores is inside the measured time, not in the count).
        source: provenance of the points.

    Fractions may exceed 1 where the fused kernel outruns that dtype's GEMMs (a CPU's bf16
    SDPA computes in fp32 internally while its bf16 GEMMs are slow); ``Curve`` requires them
    positive.

    Raises:
        SpecError: the two curves have different abscissae.
    """

    forward: Curve
    backward: Curve
    source: str = ""

    def __post_init__(self) -> None:
        if self.forward.x != self.backward.x:
            raise SpecError(
                "attention_efficiency: forward and backward curves need the same "
                f"attention_flops, got {self.forward.x} and {self.backward.x}"
            )


#: Optional HostOverhead fields (forward, backward) that are measured, and given, together.
EXTRA_PAIRS = (
    ("dtensor_forward_op_s", "dtensor_backward_op_s"),
    ("dtensor_all_reduce_forward_s", "dtensor_all_reduce_backward_s"),
    ("fsdp_unit_forward_s", "fsdp_unit_backward_s"),
    ("pipeline_action_forward_s", "pipeline_action_backward_s"),
    ("sac_forward_op_s", "sac_backward_op_s"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostOverhead:
    """Host seconds of one eager op in a training step, and how they meet the device time.

    Attributes:
        serial: True when the host is the device (a CPU rank): host and device seconds add,
            less the one bare dispatch per op that the device terms already hold (the GEMM
            curve and ``kernel_launch_s`` were timed from the host). False for an
            asynchronous device (GPU): the host runs ahead and a pass costs
            max(device, host).
        forward_op_s: host seconds of one op's forward in training (module call, dispatch,
            output allocation, autograd graph recording), per op of the cost model's list.
        backward_op_s: host seconds of running that op's autograd node in backward (its
            gradient ops' dispatch, gradient accumulation bookkeeping).
        dtensor_forward_op_s, dtensor_backward_op_s: extra host seconds of a
            tensor-parallel (DTensor) linear op over a plain one (sharding propagation,
            placement checks), or None when not measured (then 0).
        dtensor_all_reduce_forward_s, dtensor_all_reduce_backward_s: seconds of one
            tensor-parallel all-reduce of a tiny message issued by DTensor (a row-parallel
            output in forward, a column-parallel input gradient in backward) over all the
            calibration's ranks: the collective's latency and DTensor's redistribution host
            work; or None when not measured.
        fsdp_unit_forward_s, fsdp_unit_backward_s: seconds FSDP2 adds per ``fully_shard``
            unit of tiny parameters, resharded after forward, over all the calibration's
            ranks: forward (its all-gather's latency and the hooks' host work) and backward
            (all-gather and reduce-scatter latencies and host work); or None when not
            measured.
        pipeline_action_forward_s, pipeline_action_backward_s: seconds one forward / one
            backward action of a ``torch.distributed.pipelining`` schedule over all the
            calibration's ranks costs beyond its stage's ops: the schedule's per-action
            host work, posting and waiting for the action's tiny send/recv, and that
            transfer's latency; or None when not measured.
        sac_forward_op_s, sac_backward_op_s: extra host seconds per op of a region
            checkpointed with torchtitan's per-op selective policy
            (``Recompute.SELECTIVE_OP``) over the same ops unchecked: in forward, every op
            passing through torch's selective-checkpointing dispatch mode; in backward, the
            recompute of the ops the policy does not save, through that mode again; or None
            when not measured (then 0).

    Raises:
        SpecError: a time is negative or not a number, or ``serial`` is not a bool.
    """

    serial: bool
    forward_op_s: float
    backward_op_s: float
    dtensor_forward_op_s: float | None = None
    dtensor_backward_op_s: float | None = None
    dtensor_all_reduce_forward_s: float | None = None
    dtensor_all_reduce_backward_s: float | None = None
    fsdp_unit_forward_s: float | None = None
    fsdp_unit_backward_s: float | None = None
    pipeline_action_forward_s: float | None = None
    pipeline_action_backward_s: float | None = None
    sac_forward_op_s: float | None = None
    sac_backward_op_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.serial, bool):
            raise SpecError(f"host_overhead.serial must be true or false, got {self.serial!r}")
        for name in ("forward_op_s", "backward_op_s", *(n for pair in EXTRA_PAIRS for n in pair)):
            value = getattr(self, name)
            if value is None and name not in ("forward_op_s", "backward_op_s"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise SpecError(f"host_overhead.{name} must be a number >= 0, got {value!r}")
        for forward, backward in EXTRA_PAIRS:
            if (getattr(self, forward) is None) != (getattr(self, backward) is None):
                raise SpecError(f"host_overhead.{forward} and {backward} go together")

    def pass_s(self, device_s: float, *, host_s: float, num_ops: float, dispatch_s: float) -> float:
        """Seconds of a pass of ``num_ops`` ops: device work ``device_s``, host work ``host_s``.

        Serial (CPU): ``device_s + max(0, host_s - num_ops * dispatch_s)``, where
        ``dispatch_s`` is the bare per-op dispatch the device terms already hold (the
        profile's ``kernel_launch_s``). Asynchronous (GPU): ``max(device_s, host_s)``, the
        host running ahead of the device (a launch-bound pass costs the host time).
        """
        if self.serial:
            return device_s + max(0.0, host_s - num_ops * dispatch_s)
        return max(device_s, host_s)
