"""``plansim plan --cp``: the planner searches context parallelism for long sequences and
shows the ``cp`` column (after ``tp``) only when a ranked plan uses it."""

from __future__ import annotations

import csv
import io

import pytest

from plansim.cli import main

LONG = [
    "plan",
    "--model",
    "llama3-8b",
    "--gpu",
    "h100-sxm5-80gb",
    "--gpus",
    "16",
    "--gbs",
    "16",
    "--seq-len",
    "65536",
    "--top",
    "3",
    "--format",
    "csv",
    "--jobs",
    "1",
]


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


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--cp", "1,x"], "--cp must be positive integers separated by commas"),
        (["--cp", "0"], "--cp must be positive integers separated by commas"),
        (["--cp", "2", "--attention", "unfused"], "--cp 2 needs --attention flash"),
    ],
)
def test_bad_cp_is_one_clear_error(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*LONG, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
