"""`plansim simulate`'s "where the step goes" table: compute, exposed communication by kind
and idle time, in the mean over the pipeline ranks, adding up to the step."""

from __future__ import annotations

import json

import pytest

from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.io.profiles import load_profile
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.report.tables import plan_row, step_breakdown_table
from plansim.specs.plan import Recompute, Schedule, plan_from_fields


def _evaluate(**kw: object) -> Evaluation:
    plan = plan_from_fields(**kw)  # type: ignore[arg-type]
    out = evaluate(resolve_model("gpt3-175b"), plan, load_profile("a100-sxm4-80gb"))
    assert isinstance(out, Evaluation)
    return out


def test_parts_add_up_to_the_step_and_match_the_simulation() -> None:
    ev = _evaluate(
        tp=8, pp=16, dp=8, micro_batch_size=1, global_batch_size=128, recompute=Recompute.FULL
    )
    table = step_breakdown_table(ev).set_index("part")
    assert table.loc["step", "seconds"] == round(ev.step_time_s, 3)
    parts = table.drop(index="step")
    assert parts["seconds"].sum() == pytest.approx(ev.step_time_s, abs=1e-3 * len(parts))
    busy = ev.result.compute_busy_s
    assert table.loc["compute (kernels)", "seconds"] == round(sum(busy) / len(busy), 3)
    for kind, seconds in ev.exposed_comm_s_by_kind.items():
        if seconds > 0:
            assert table.loc[f"exposed {kind}", "seconds"] == round(seconds / 16, 3)
    assert "exposed tp_comm" in table.index and "exposed recv_forward" in table.index
    # 16 stages and 16 micro-batches: 1F1B idles (p - 1) / (m + p - 1) of the pipeline
    assert table.loc["idle (bubbles, waits)", "pct_of_step"] > 30.0


def test_more_micro_batches_leave_less_idle_time() -> None:
    kw: dict[str, object] = dict(
        tp=8,
        pp=8,
        dp=1,
        micro_batch_size=1,
        schedule=Schedule.ONE_F_ONE_B,
        recompute=Recompute.FULL,
    )
    few = step_breakdown_table(_evaluate(global_batch_size=8, **kw)).set_index("part")
    many = step_breakdown_table(_evaluate(global_batch_size=64, **kw)).set_index("part")
    idle = "idle (bubbles, waits)"
    assert many.loc[idle, "pct_of_step"] < few.loc[idle, "pct_of_step"] / 2


def test_simulate_prints_the_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024"]
    assert main([*args, "--tp", "8", "--pp", "16", "--mbs", "1", "--gbs", "1536"]) == 0
    out = capsys.readouterr().out
    assert "where the step goes (mean over the 16 pipeline ranks):" in out
    assert "compute (kernels)" in out and "exposed tp_comm" in out


def test_ranked_table_exposed_share_is_the_breakdowns_exposed_rows() -> None:
    ev = _evaluate(
        tp=8, pp=16, dp=8, micro_batch_size=1, global_batch_size=128, recompute=Recompute.FULL
    )
    table = step_breakdown_table(ev)
    exposed = table[table["part"].str.startswith("exposed ")]["seconds"].sum()
    assert plan_row(ev)["exposed_comm_pct"] == pytest.approx(
        100 * exposed / ev.step_time_s, abs=0.1
    )
    assert 0.0 < plan_row(ev)["exposed_comm_pct"] < 100.0


def test_simulate_json_carries_the_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024"]
    flags = ["--tp", "8", "--pp", "16", "--mbs", "1", "--gbs", "1536", "--format", "json"]
    assert main([*args, *flags]) == 0
    doc = json.loads(capsys.readouterr().out)
    parts = doc["step_breakdown_s"]
    assert parts["step"] == pytest.approx(doc["step_time_s"], abs=1e-3)
    rest = [seconds for name, seconds in parts.items() if name != "step"]
    assert sum(rest) == pytest.approx(parts["step"], abs=1e-3 * len(rest))
