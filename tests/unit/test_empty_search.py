"""``plansim plan`` says why a constrained search enumerated nothing
(plansim.commands.empty_search)."""

from __future__ import annotations

import pytest

from plansim.cli import main

BASE = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "16", "--gbs", "32"]


@pytest.mark.parametrize(
    ("flags", "lines"),
    [
        (["--tp", "3"], ["meets --tp 3", "without --tp 3: tp in (1, 2, 4, 8, 16)"]),
        (
            ["--pp", "1", "--schedule", "zb-h1"],
            [
                "meets --pp 1 --schedule zb-h1",
                "without --pp 1: pp in (2, 4, 8, 16)",
                "without --schedule zb-h1: schedule in (1f1b)",
            ],
        ),
        (["--cp", "3"], ["meets --cp 3", "without --cp 3: cp in (1, 2, 4, 8, 16)"]),
        (
            ["--dp-sync", "parameter-server", "--zero", "2"],
            [
                "meets --zero 2 --dp-sync parameter-server",
                "without --zero 2: zero_stage in (0)",
                "without --dp-sync parameter-server: dp_sync in (ring)",
            ],
        ),
    ],
)
def test_an_empty_search_names_the_constraints_and_what_each_leaves_out(
    flags: list[str], lines: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*BASE, *flags]) == 1  # an answer, but no plan
    out = capsys.readouterr().out
    assert "0 candidates" in out and "no layout of 16 GPUs and global batch 32" in out
    for line in lines:
        assert line in out


def test_a_search_with_candidates_prints_no_such_note(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--tp", "8", "--pp", "2", "--top", "1"]) == 0
    assert "not enumerated: no layout" not in capsys.readouterr().out
