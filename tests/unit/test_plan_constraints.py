"""``plansim plan`` search constraints: ``--cp`` (context parallelism for long sequences; the
``cp`` column, after ``tp``, only when a ranked plan uses it) and ``--tp``, ``--pp``, ``--dp``,
``--vpp``, ``--mbs``, ``--zero``, ``--recompute``, ``--schedule`` (only the listed values)."""

from __future__ import annotations

import argparse
import csv
import io

import pytest

from plansim.cli import main
from plansim.commands.plan_space import add_constraint_args, constrained_space
from plansim.planner.space import SearchSpace
from plansim.specs.plan import Recompute


def _plan(model: str, gpu: str, gpus: int, gbs: int, *extra: str) -> list[str]:
    """``plansim plan`` arguments with CSV output on one worker."""
    head = ["plan", "--model", model, "--gpu", gpu, "--gpus", str(gpus), "--gbs", str(gbs)]
    return [*head, "--format", "csv", "--jobs", "1", *extra]


LONG = _plan("llama3-8b", "h100-sxm5-80gb", 16, 16, "--seq-len", "65536", "--top", "3")


def _rows(capsys: pytest.CaptureFixture[str], args: list[str]) -> list[dict[str, str]]:
    assert main(args) == 0
    return list(csv.DictReader(io.StringIO(capsys.readouterr().out)))


def test_long_sequences_rank_context_parallel_layouts_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    without = _rows(capsys, LONG)
    assert "cp" not in without[0]  # the default search: cp 1 only, columns as before
    with_cp = _rows(capsys, [*LONG, "--cp", "4,1,2,2"])
    assert list(with_cp[0])[:3] == ["rank", "tp", "cp"]
    for row in with_cp:
        sizes = [int(row[k]) for k in ("tp", "cp", "pp", "dp")]
        assert sizes[0] * sizes[1] * sizes[2] * sizes[3] == 16
    best = with_cp[0]
    # at 64K tokens per sequence, splitting each sequence over cp ranks beats recomputing
    # activations (the best plan without cp recomputes, the one with cp does not)
    assert int(best["cp"]) > 1 and best["recompute"] == "none"
    assert without[0]["recompute"] != "none"
    assert float(best["step_time_s"]) < float(without[0]["step_time_s"])


SMALL = _plan("megatron-1.7b", "a100-sxm4-80gb", 16, 64, "--top", "200")


def test_constraints_keep_only_the_listed_values(capsys: pytest.CaptureFixture[str]) -> None:
    free = _rows(capsys, SMALL)
    assert len({r["zero"] for r in free}) > 1 and len({r["tp"] for r in free}) > 1
    wanted = {
        "tp": {"1", "2"},
        "pp": {"1", "2"},
        "zero": {"2"},
        "recompute": {"none", "selective"},
        "schedule": {"1f1b"},
        "mbs": {"2", "4"},
        "vpp": {"1"},
    }
    flags = {"zero": "--zero", "recompute": "--recompute", "schedule": "--schedule"}
    args = [*SMALL]
    for key, values in wanted.items():
        args += [flags.get(key, f"--{key}"), ",".join(sorted(values))]
    kept = _rows(capsys, args)
    assert kept
    for row in kept:
        assert all(row[key] in values for key, values in wanted.items()), row
    # the constrained search's best is the best free plan that meets the constraints
    allowed = [r for r in free if all(r[k] in v for k, v in wanted.items())]
    assert allowed and allowed[0] != free[0]
    assert kept[0]["step_time_s"] == allowed[0]["step_time_s"]
    assert float(kept[0]["step_time_s"]) > float(free[0]["step_time_s"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--cp", "1,x"], "--cp must be positive integers separated by commas"),
        (["--cp", "0"], "--cp must be positive integers separated by commas"),
        (["--cp", "2", "--attention", "unfused"], "--cp 2 needs --attention flash"),
        (["--tp", "-2"], "--tp must be positive integers separated by commas"),
        (["--zero", "1,4"], "--zero '4' is not allowed; choose from 0, 1, 2, 3"),
        (["--recompute", "partial"], "--recompute 'partial' is not allowed; choose from none"),
        (["--schedule", "1f1b,zb"], "--schedule 'zb' is not allowed; choose from gpipe, 1f1b"),
        (
            ["--recompute", "selective-op", "--attention", "unfused"],
            "--recompute selective-op needs --attention flash",
        ),
    ],
)
def test_bad_cp_is_one_clear_error(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*LONG, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_recompute_list_and_the_selective_op_flag_add_up() -> None:
    parser = argparse.ArgumentParser()
    add_constraint_args(parser)
    parser.add_argument("--recompute-selective-op", action="store_true")
    args = parser.parse_args(["--recompute", "none,full,none", "--recompute-selective-op"])
    space = constrained_space(SearchSpace(), args)
    assert space.recomputes == (Recompute.NONE, Recompute.FULL, Recompute.SELECTIVE_OP)
    untouched = constrained_space(SearchSpace(), parser.parse_args([]))
    assert untouched == SearchSpace()
