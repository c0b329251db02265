"""Planner speed: wall time and plans per second of the GPT-3 175B / 1024 A100 search.

Prints figures only (no target yet; the planner-speed issue sets one). Run:
    .venv/bin/python benchmarks/bench_planner.py [--simulate-top N]
"""

from __future__ import annotations

import argparse
import time

from plansim.catalog import resolve_model
from plansim.io.profiles import load_profile
from plansim.planner.enumerate import SearchSpace
from plansim.planner.search import search


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate-top", type=int, default=64)
    args = parser.parse_args()
    model = resolve_model("gpt3-175b")
    profile = load_profile("a100-sxm4-80gb")
    start = time.perf_counter()
    result = search(
        model,
        profile,
        num_gpus=1024,
        global_batch_size=1536,
        space=SearchSpace(),
        simulate_top=args.simulate_top,
    )
    wall_s = time.perf_counter() - start
    events = sum(ev.result.num_events for ev in result.ranked)
    best = result.ranked[0]
    print("search: gpt3-175b on 1024 x a100-sxm4-80gb, gbs 1536")
    print(f"  candidates          {result.num_candidates}")
    print(f"  feasible            {result.num_feasible}")
    print(f"  simulated (events)  {len(result.ranked)} ({events} events)")
    print(f"  wall time           {wall_s:.2f} s")
    print(f"  plans per second    {result.num_candidates / wall_s:.0f} (candidates checked)")
    print(f"  simulations per s   {len(result.ranked) / wall_s:.1f}")
    print(f"  best                {best.plan.label()}  {best.step_time_s:.2f} s/step")


if __name__ == "__main__":
    main()
