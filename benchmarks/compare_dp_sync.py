"""Ring collectives against a parameter server: simulated step time per DP synchronisation.

For a few models and GPU counts on a datasheet profile (default ``a100-sxm4-80gb``), one
fixed layout each, simulated with: ring all-reduce (ZeRO-0), ring reduce-scatter +
all-gather (ZeRO-1, the same optimizer shard as colocated servers), a colocated parameter
server (``ps``), and dedicated servers, K = W (one per worker, ``psW``) and K = W / 4
(``psW/4``), W = the job's GPUs. Each cell is the step time in seconds; the ``sync`` columns
give the DP traffic on pipeline rank 0's tail (push + pull, or the collectives), seconds.
The classic trade-off shows up: colocated servers cost one round trip per phase instead of
a ring's growing latency but, flat (no in-node aggregation), send the off-node shards over
one NIC where the ring spreads them over all of a node's NICs; too few dedicated servers
make their NICs the bottleneck by W / K. Run:
    .venv/bin/python benchmarks/compare_dp_sync.py [--gpu PROFILE] [--overlap-grad-reduce]
"""

from __future__ import annotations

import argparse

from plansim.analytic.cost import build_pipeline_work
from plansim.catalog import resolve_model
from plansim.io.profiles import load_profile
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import DpSync, ParallelPlan, plan_from_fields

#: (model, GPUs, tp, pp, micro-batch size, global batch size)
CASES = (
    ("megatron-1.7b", 8, 1, 1, 4, 64),
    ("megatron-1.7b", 64, 1, 1, 4, 512),
    ("megatron-1.7b", 64, 8, 1, 4, 64),
    ("megatron-1.7b", 1024, 8, 1, 1, 128),
    ("llama3-8b", 64, 8, 1, 1, 64),
    ("llama3-8b", 512, 8, 1, 1, 512),
    ("llama3-8b", 512, 8, 4, 1, 512),
)

#: Non-DP kinds on a rank's tail (the rest is DP traffic).
_NOT_SYNC = ("optimizer", "ps_update", "embedding_grad_comm")


def _variants(plan: ParallelPlan) -> dict[str, ParallelPlan]:
    ps = plan.with_fields(dp_sync=DpSync.PARAMETER_SERVER)
    return {
        "ring-z0": plan,
        "ring-z1": plan.with_fields(zero_stage=1),
        "ps": ps,
        "psW": ps.with_fields(ps_servers=plan.num_gpus),
        "psW/4": ps.with_fields(ps_servers=plan.num_gpus // 4),
    }


def _sync_s(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile) -> float:
    work = build_pipeline_work(model, plan, profile)
    rank = work.ranks[0]
    tail = sum(s.duration_s for s in rank.grad_sync + rank.optimizer if s.kind not in _NOT_SYNC)
    buckets = sum(b.segment.duration_s for st in work.stages[:: plan.pp] for b in st.grad_buckets)
    return tail + buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="a100-sxm4-80gb", help="hardware profile")
    parser.add_argument("--overlap-grad-reduce", action="store_true")
    args = parser.parse_args()
    profile = load_profile(args.gpu)
    names = tuple(
        _variants(plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1))
    )
    head = f"{'model':<14} {'GPUs':>5} {'layout':<10}" + "".join(f" {n:>8}" for n in names)
    print(f"step time (s) on {profile.name}; sync (s) below each row")
    print(head)
    for name, gpus, tp, pp, mbs, gbs in CASES:
        model = resolve_model(name)
        dp = gpus // (tp * pp)
        base = plan_from_fields(
            dp=dp, tp=tp, pp=pp, micro_batch_size=mbs, global_batch_size=gbs,
            overlap_grad_reduce=args.overlap_grad_reduce,
        )  # fmt: skip
        steps, syncs = [], []
        for plan in _variants(base).values():
            ev = evaluate(model, plan, profile)
            steps.append(f"{ev.step_time_s:8.3f}" if isinstance(ev, Evaluation) else "     oom")
            syncs.append(f"{_sync_s(model, plan, profile):8.3f}")
        layout = f"tp{tp} pp{pp} dp{dp}"
        print(f"{name:<14} {gpus:>5} {layout:<10} " + " ".join(steps))
        print(f"{'':<14} {'':>5} {'  sync':<10} " + " ".join(syncs))


if __name__ == "__main__":
    main()
