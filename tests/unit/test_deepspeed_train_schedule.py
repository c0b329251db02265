"""DeepSpeed's pipeline engine runs plansim's 1F1B order (the back-test's rule for its rows).

DeepSpeed's ``TrainSchedule`` (``deepspeed/runtime/pipe/schedule.py``, the only training
schedule of its ``PipelineEngine``) runs 2 (m + p - 1) steps; at step t, stage s does a
forward when t and s have the same parity, of micro-batch t // 2 - s // 2, else a backward
of micro-batch t // 2 - p + 1 + s // 2; a step whose micro-batch is outside 0..m-1 is idle.
Its sends and receives are blocking and paired by neighbours (forward step: receive the
activation, then send the previous backward's gradient; backward step: send the previous
forward's activation, then receive the gradient), which are the exchanges of Megatron-LM's
non-interleaved 1F1B, one after the other instead of batched. So the back-test prices
DeepSpeed pipeline rows with ``1f1b`` (``plansim.planner.run_framework``).
"""

from __future__ import annotations

import pytest

from plansim.schedule.builders import build_actions
from plansim.specs.plan import Schedule


def deepspeed_train_order(num_stages: int, num_microbatches: int, stage: int) -> list[str]:
    """Stage ``stage``'s computations in DeepSpeed TrainSchedule step order, as "F3", "B0"."""
    order = []
    for step in range(2 * (num_microbatches + num_stages - 1)):
        forward = step % 2 == stage % 2
        lag = stage // 2 if forward else num_stages - 1 - stage // 2
        microbatch = step // 2 - lag
        if 0 <= microbatch < num_microbatches:
            order.append(f"{'F' if forward else 'B'}{microbatch}")
    return order


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4, 7, 8])
@pytest.mark.parametrize("num_microbatches", [1, 2, 5, 8, 13])
def test_deepspeed_train_schedule_is_plansims_1f1b(num_stages: int, num_microbatches: int) -> None:
    actions = build_actions(
        Schedule.ONE_F_ONE_B, num_ranks=num_stages, num_microbatches=num_microbatches
    )
    for stage in range(num_stages):
        ours = [f"{a.kind.value}{a.microbatch}" for a in actions[stage]]
        assert ours == deepspeed_train_order(num_stages, num_microbatches, stage)


def test_the_order_differs_from_gpipe() -> None:
    """The comparison can fail: GPipe's order (all forwards first) is not DeepSpeed's."""
    gpipe = build_actions(Schedule.GPIPE, num_ranks=4, num_microbatches=8)
    ours = [f"{a.kind.value}{a.microbatch}" for a in gpipe[0]]
    assert ours != deepspeed_train_order(4, 8, 0)
    assert deepspeed_train_order(4, 8, 0)[:5] == ["F0", "F1", "F2", "F3", "B0"]
