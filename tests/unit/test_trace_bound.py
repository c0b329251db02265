"""Traces and plots of long steps: the steady-state window in full, memory flat in the
micro-batch count, ``--whole-step`` for every micro-batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plansim.cli import main

SIM = ["simulate", "--model", "megatron-1.7b", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
SIM += ["--tp", "4", "--pp", "2", "--mbs", "1"]


def _microbatches(trace: dict[str, object]) -> set[int]:
    events = trace["traceEvents"]
    assert isinstance(events, list)
    return {
        int(e["args"]["microbatch"])
        for e in events
        if e.get("ph") == "X" and e.get("args", {}).get("microbatch", -1) not in (-1, None)
    }


def test_a_long_step_traces_its_steady_state_window_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bounded, whole = tmp_path / "bounded.json", tmp_path / "whole.json"
    # 512 micro-batches on pp 2: 8 windows of 64, the outputs show the longer short step
    assert main([*SIM, "--gbs", "512", "--trace", str(bounded), "--format", "json"]) == 0
    out = capsys.readouterr()
    step_bounded = json.loads(out.out)["step_time_s"]
    assert "the outputs show micro-batches 0-" in out.err
    doc = json.loads(bounded.read_text())
    shown = _microbatches(doc)
    assert 64 < len(shown) < 512 and shown == set(range(len(shown)))
    assert "of 512 shown" in doc["otherData"]["title"]
    argv = [*SIM, "--gbs", "512", "--trace", str(whole), "--whole-step", "--format", "json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "the outputs show" not in out.err
    assert _microbatches(json.loads(whole.read_text())) == set(range(512))
    # the figures are the whole step's either way (steady-state extrapolation is exact)
    assert json.loads(out.out)["step_time_s"] == pytest.approx(step_bounded, rel=1e-9)


def test_a_short_step_is_traced_whole_without_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.json"
    assert main([*SIM, "--gbs", "64", "--trace", str(trace)]) == 0
    assert "the outputs show" not in capsys.readouterr().err
    doc = json.loads(trace.read_text())
    assert _microbatches(doc) == set(range(64)) and "shown" not in doc["otherData"]["title"]
