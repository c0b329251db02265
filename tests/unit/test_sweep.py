"""plansim sweep: grid, table, executors and input errors."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.io.profiles import load_profile
from plansim.planner.enumerate import SearchSpace
from plansim.planner.search import search
from plansim.planner.sweep import SweepSettings, run_sweep, sweep_grid

BASE = ["sweep", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]


def test_sweep_writes_one_row_per_cell_in_grid_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "grid.csv"
    args = [
        "sweep",
        "--model",
        "megatron-1.7b,gpt3-175b",
        "--gpu",
        "a100-sxm4-80gb",
        "--gpus",
        "8,16",
        "--gbs",
        "16",
        "--out",
        str(out),
        "--jobs",
        "2",
    ]
    assert main(args) == 0
    assert "4 cells; wrote" in capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    cells = [(r["model"], r["num_gpus"]) for r in rows]
    assert cells == [
        ("megatron-1.7b", "8"),
        ("megatron-1.7b", "16"),
        ("gpt3-175b", "8"),
        ("gpt3-175b", "16"),
    ]
    ok, full = rows[0], rows[2]
    # the row is the exact search's best plan for that cell
    best = search(
        resolve_model("megatron-1.7b"),
        load_profile("a100-sxm4-80gb"),
        num_gpus=8,
        global_batch_size=16,
        space=SearchSpace(),
        top_k=1,
    ).ranked[0]
    assert ok["status"] == "ok" and ok["plan"] == best.plan.label()
    assert float(ok["step_time_s"]) == best.step_time_s
    assert int(ok["tp"]) == best.plan.tp and int(ok["num_feasible"]) > 0
    # 175B does not fit on 8 or 16 A100s: no plan, and the rejection summary says why
    assert full["status"] == "no feasible plan" and full["plan"] == "" and full["tp"] == ""
    assert "out of memory" in full["rejections"] and full["num_feasible"] == "0"
    # same table for one job
    again = tmp_path / "again.csv"
    assert main([*args[:-2], "--jobs", "1", "--out", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_run_sweep_local_rows_match_grid() -> None:
    cells = sweep_grid(["megatron-1.7b"], ["a100-sxm4-80gb"], [8], [16, 32])
    rows = run_sweep(cells, SweepSettings(), executor="local", jobs=1)
    assert [r["global_batch_size"] for r in rows] == [16, 32]
    assert all(r["status"] == "ok" and r["step_time_s"] > 0 for r in rows)
    assert rows[1]["tokens_per_s"] > 0 and 0 < rows[1]["mfu"] < 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gbs", "16,x", "--out", "OUT.csv"], "--gbs: 'x' is not a positive integer"),
        (["--gbs", "0", "--out", "OUT.csv"], "--gbs must be a positive integer"),
        (["--gbs", "16,", "--out", "OUT.csv"], "empty item"),
        (["--gbs", "16", "--out", "OUT.txt"], "must end in one of: .csv, .parquet"),
        (["--gbs", "16", "--out", "OUT.csv", "--jobs", "0"], "--jobs must be a positive"),
    ],
)
def test_sweep_bad_input_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    args = [a.replace("OUT", str(tmp_path / "t")) for a in extra]
    assert main([*BASE, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plansim: error: ") and message in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_sweep_unknown_model_fails_before_searching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sweep", "--model", "megatron-1.7b,nope", "--gpu", "a100-sxm4-80gb"]
    assert main([*args, "--gpus", "8", "--gbs", "16", "--out", str(tmp_path / "t.csv")]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is not None, reason="pyarrow installed")
def test_parquet_without_pyarrow_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*BASE, "--gbs", "16", "--out", str(tmp_path / "t.parquet")]) == 2
    assert "needs the 'pyarrow' package" in capsys.readouterr().err
