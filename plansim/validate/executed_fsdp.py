"""How the validate run shards ZeRO-2/3 with FSDP2, and the plan that prices it (pure).

The runner wraps each block and the stage root in FSDP2 ``fully_shard``
(``plansim.validate.parallelize.apply_zero``). Without pipelining (pp == 1) a plain loop runs
forward and backward per micro-batch: ZeRO-3 reshards after forward and gathers again for
backward, ZeRO-2 keeps the parameters through the backward (``reshard_after_forward=False``,
FSDP1's ``SHARD_GRAD_OP``), and both reduce-scatter every micro-batch's gradients. FSDP2
shards a ZeRO-2 run's parameters at rest too, so each micro-batch's forward gathers them:
priced as ZeRO-3 with ``reshard_after_forward`` False (plansim's ZeRO-2, DeepSpeed's, keeps
16-bit parameters replicated and gathers once per step; on a dp2 run of four micro-batches
on a CPU that left three gathers per step out, 28.6% fast against 16.1% for ZeRO-0).

With pp > 1 ``torch.distributed.pipelining`` drives the stages, and its stage turns off
FSDP2's gradient sync and resharding for every backward but the step's last
(``_PipelineStageBase.backward_maybe_with_nosync``: ``set_requires_gradient_sync(False)``,
``set_reshard_after_backward(False)``; ``perform_reduce_grad`` turns them back on for the
``REDUCE_GRAD`` action after the last backward). The runner then shards as torchtitan does
with pp > 1 (``reshard_after_forward = not pp_enabled`` in ``parallelize.py``: "For PP, do
not reshard after forward to avoid per-microbatch all-gathers"), so ZeRO-2 and ZeRO-3 run
alike: each unit is gathered once per step (in the first micro-batch's forward), the
gradients accumulate unsharded, and one reduce-scatter per unit follows the last backward.
That is plansim's ZeRO-3 ``per-step`` fetch (``plansim.analytic.zero3``), which
:func:`executed_zero_plan` gives the validator's twin.

With resharding after forward a pipelined ZeRO-3 run would instead gather every unit again
in every micro-batch's forward while still reducing once per step, a mix that no plansim
fetch mode prices (the validator's twin had priced it as ``layer-sync`` per micro-batch:
12 reduce-scatters per rank where the run has one, on a tp1 pp2 dp2 run of 4 micro-batches).
"""

from __future__ import annotations

from plansim.analytic.ranks import dp_cp_size
from plansim.specs.plan import ParallelPlan, Zero3ParamFetch


def runs_per_step(plan: ParallelPlan) -> bool:
    """True when the validate run's FSDP2 gathers and reduces once per step: ZeRO-2/3 with
    dp * cp > 1 under pipelining (pp > 1; module docstring)."""
    return plan.pp > 1 and plan.zero_stage >= 2 and dp_cp_size(plan) > 1


def reshard_after_forward(plan: ParallelPlan) -> bool:
    """FSDP2's ``reshard_after_forward`` for the run's units: ZeRO-3 without pipelining only
    (with pp > 1 the units stay gathered for the step, as torchtitan shards them; with a
    zero-bubble schedule, which needs pp > 1, FSDP2 resharding plus a split backward also
    gave wrong gradients with dp >= 2, docs/architecture.md)."""
    return plan.zero_stage == 3 and plan.pp == 1


def executed_zero_plan(plan: ParallelPlan) -> ParallelPlan:
    """``plan`` with the ZeRO stage and fetch mode that price what the run executes: ZeRO-3
    ``per-step`` when :func:`runs_per_step` (a ZeRO-2 run included: FSDP2 shards its
    parameters at rest too); a ZeRO-2 run without pipelining as ZeRO-3 without resharding
    after forward; else ``plan`` unchanged."""
    if runs_per_step(plan):
        return plan.with_fields(zero_stage=3, zero3_param_fetch=Zero3ParamFetch.PER_STEP)
    if plan.zero_stage == 2 and dp_cp_size(plan) > 1:
        return plan.with_fields(zero_stage=3, reshard_after_forward=False)
    return plan
