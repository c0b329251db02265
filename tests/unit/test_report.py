"""Reports people look at: Chrome trace export, Gantt / memory / Pareto PNGs, output flags."""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path

import pytest

from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.io.outputs import OutputFileError, write_bytes_atomic, write_json_atomic
from plansim.io.profiles import load_profile
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.report import plots
from plansim.report.trace import STREAM_TIDS, chrome_trace, event_name, write_trace
from plansim.specs.plan import Recompute, Schedule, plan_from_fields

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GPU = "a100-sxm4-80gb"


def _evaluate(model: str, **plan: object) -> Evaluation:
    outcome = evaluate(resolve_model(model), plan_from_fields(**plan), load_profile(GPU))
    assert isinstance(outcome, Evaluation), outcome
    return outcome


@pytest.fixture(scope="module")
def small() -> Evaluation:
    """megatron-1.7b on 8 GPUs, pp 4, 1F1B, m = 8 (170 events)."""
    return _evaluate("megatron-1.7b", dp=2, tp=1, pp=4, micro_batch_size=1, global_batch_size=16)


@pytest.fixture(scope="module")
def interleaved() -> Evaluation:
    """The same with interleaved 1F1B, vpp 2: ranks hold stages r and r + 4."""
    return _evaluate(
        "megatron-1.7b",
        dp=2,
        tp=1,
        pp=4,
        vpp=2,
        micro_batch_size=1,
        global_batch_size=16,
        schedule=Schedule.INTERLEAVED_1F1B,
    )


# ------------------------------------------------------------------------------ trace


def _by_phase(trace: dict[str, object], phase: str) -> list[dict[str, object]]:
    events = trace["traceEvents"]
    assert isinstance(events, list)
    return [e for e in events if e["ph"] == phase]


def test_trace_round_trips_through_json_with_one_x_event_per_row(
    small: Evaluation, tmp_path: Path
) -> None:
    timeline = small.result.timeline
    path = write_trace(tmp_path / "t.json", chrome_trace(timeline, memory=None, title="small"))
    doc = json.loads(path.read_text())
    assert doc["otherData"]["title"] == "small" and isinstance(doc["traceEvents"], list)
    xs = _by_phase(doc, "X")
    assert len(xs) == len(timeline)
    for event, row in zip(xs, timeline.itertuples(index=False), strict=True):
        assert isinstance(event["ts"], float) and isinstance(event["dur"], float)
        assert event["ts"] >= 0 and event["dur"] >= 0
        assert event["ts"] == pytest.approx(row.start_s * 1e6, abs=1e-3)  # microseconds
        assert event["dur"] == pytest.approx((row.end_s - row.start_s) * 1e6, abs=2e-3)
        assert event["pid"] == row.rank and event["tid"] == STREAM_TIDS[row.stream]
        assert event["cat"] == row.kind
        assert event["args"] == {
            "stage": row.stage,
            "microbatch": row.microbatch,
            "bytes": row.bytes,
        }
    assert {e["pid"] for e in xs} == {0, 1, 2, 3}
    assert _by_phase(doc, "C") == []


def test_trace_names_processes_threads_and_events(interleaved: Evaluation) -> None:
    trace = chrome_trace(interleaved.result.timeline, memory=None, title="vpp2")
    meta = _by_phase(trace, "M")
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert processes == {r: f"rank {r} (pp stages {r}, {r + 4})" for r in range(4)}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    for rank in range(4):
        for stream in ("compute", "pp_send", "pp_recv", "dp"):
            assert threads[(rank, STREAM_TIDS[stream])] == stream
    names = {e["name"] for e in _by_phase(trace, "X")}
    assert {"F mb3 s1", "B mb3 s5", "send_forward mb0 s0", "optimizer"} <= names
    assert event_name("backward_weight", 2, 7) == "W mb7 s2"
    assert event_name("dp_comm", 3, -1) == "dp_comm s3"


def test_trace_memory_counters_are_gib_per_rank(small: Evaluation) -> None:
    memory = small.result.memory
    trace = chrome_trace(small.result.timeline, memory=memory, title="m")
    counters = _by_phase(trace, "C")
    assert len(counters) == len(memory)
    got = sorted((c["pid"], c["ts"], c["args"]["GiB"]) for c in counters)
    want = sorted(
        (int(r), round(t * 1e6, 3), round(b / 2**30, 6))
        for r, t, b in memory.itertuples(index=False)
    )
    assert got == want
    assert all(c["name"] == "memory" for c in counters)


def test_trace_is_deterministic_and_written_with_sorted_keys(
    small: Evaluation, tmp_path: Path
) -> None:
    result = small.result
    first = write_trace(
        tmp_path / "a.json", chrome_trace(result.timeline, memory=result.memory, title="x")
    )
    shuffled = result.timeline.sample(frac=1.0, random_state=3)  # order must not matter
    second = write_trace(
        tmp_path / "b.json", chrome_trace(shuffled, memory=result.memory, title="x")
    )
    assert first.read_bytes() == second.read_bytes()
    text = first.read_text()
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":")) + "\n"
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json"]  # no temporary files left


# ------------------------------------------------------------------------------ atomic writes


def test_atomic_write_keeps_the_old_file_when_replace_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.png"
    path.write_bytes(b"old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OutputFileError, match=r"--plot: cannot write .*out\.png.*No space left"):
        write_bytes_atomic(path, b"new", label="--plot")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.png"]


def test_atomic_write_refuses_missing_folders_and_nan(tmp_path: Path) -> None:
    with pytest.raises(OutputFileError, match=r"^--trace: cannot write .*does not exist$"):
        write_json_atomic(tmp_path / "missing" / "t.json", {}, label="--trace")
    with pytest.raises(OutputFileError, match="is a directory"):
        write_json_atomic(tmp_path, {}, label="--trace")
    with pytest.raises(ValueError, match="JSON"):
        write_json_atomic(tmp_path / "t.json", {"x": float("nan")}, label="--trace")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------ Pareto front


def test_pareto_front_on_hand_made_points() -> None:
    points = [
        (1.0, 5.0),  # 0 front
        (2.0, 3.0),  # 1 front
        (3.0, 4.0),  # 2 dominated by 1
        (4.0, 1.0),  # 3 front
        (2.0, 3.0),  # 4 duplicate of 1: front too
        (5.0, 1.0),  # 5 same memory as 3, slower: dominated
        (1.0, 6.0),  # 6 same time as 0, heavier: dominated
        (0.5, 10.0),  # 7 front (fastest)
    ]
    assert plots.pareto_front(points) == (7, 0, 1, 4, 3)
    assert plots.pareto_front([]) == ()
    assert plots.pareto_front([(3.0, 3.0)]) == (0,)


def test_pareto_front_matches_the_definition_on_random_points() -> None:
    rng = random.Random(5)
    for _ in range(50):
        points = [(float(rng.randint(0, 9)), float(rng.randint(0, 9))) for _ in range(25)]

        def dominated(i: int, pts: list[tuple[float, float]] = points) -> bool:
            (x, y) = pts[i]
            return any(a <= x and b <= y and (a, b) != (x, y) for a, b in pts)

        want = {i for i in range(len(points)) if not dominated(i)}
        got = plots.pareto_front(points)
        assert set(got) == want
        assert [points[i] for i in got] == sorted(points[i] for i in got)


# ------------------------------------------------------------------------------ PNGs


def _png(path: Path) -> bytes:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000
    return data


def test_gantt_png_is_written_and_byte_identical(small: Evaluation, tmp_path: Path) -> None:
    timeline = small.result.timeline
    first = _png(plots.plot_gantt(timeline, tmp_path / "a.png", title="small"))
    second = _png(plots.plot_gantt(timeline, tmp_path / "b.png", title="small"))
    assert first == second
    assert b"Software" not in first and b"tEXt" not in first
    assert first != _png(plots.plot_gantt(timeline, tmp_path / "c.png", title="other"))
    assert sorted(os.listdir(tmp_path)) == ["a.png", "b.png", "c.png"]


def test_gantt_labels_microbatches_and_shows_idle(interleaved: Evaluation) -> None:
    fig = plots.gantt_figure(interleaved.result.timeline, title="vpp2")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    numbers = [int(t) for t in texts if t.isdigit()]
    # 8 micro-batches x 2 chunks x (F, B) per rank, 4 ranks: all wide enough at this scale.
    assert len(numbers) == 8 * 2 * 2 * 4 and set(numbers) == set(range(8))
    idle = [t for t in texts if t.startswith("idle ")]
    want = [f"idle {100 * b:.1f}%" for b in interleaved.result.per_rank_bubble_fraction]
    assert idle == want
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:2] == ["forward (F)", "backward (B)"] and "idle" in legend
    assert any("later model chunk" in t for t in legend)


def test_big_gantt_skips_labels(tmp_path: Path) -> None:
    big = _evaluate(
        "gpt3-175b",
        dp=8,
        tp=8,
        pp=16,
        micro_batch_size=1,
        global_batch_size=1536,
        recompute=Recompute.FULL,
    )
    assert len(big.result.timeline) > 25_000
    plots.plot_gantt(big.result.timeline, tmp_path / "big.png", title="gpt3 p16 m192")
    _png(tmp_path / "big.png")
    fig = plots.gantt_figure(big.result.timeline, title="gpt3 p16 m192")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert not [t for t in texts if t.isdigit()]  # 9216 compute bars: no micro-batch labels
    assert len([t for t in texts if t.startswith("idle ")]) == 16


def test_memory_png_is_written_and_byte_identical(small: Evaluation, tmp_path: Path) -> None:
    memory = small.result.memory
    kwargs = {"title": "mem", "capacity_bytes": 80 * 2**30, "end_s": small.step_time_s}
    first = _png(plots.plot_memory(memory, tmp_path / "a.png", **kwargs))
    assert first == _png(plots.plot_memory(memory, tmp_path / "b.png", **kwargs))
    fig = plots.memory_figure(memory, title="mem", capacity_bytes=80 * 2**30)
    full, zoom = fig.axes
    assert [line.get_label() for line in zoom.get_lines()][:4] == [f"rank {r}" for r in range(4)]
    assert full.get_ylim()[0] == 0.0 and full.get_ylim()[1] > 80.0
    peak_gib = max(small.result.peak_memory_bytes) / 2**30
    assert any(f"peak {peak_gib:.2f} GiB" in t.get_text() for t in zoom.texts)


def test_pareto_png_marks_the_front_and_the_fastest_plan(
    small: Evaluation, interleaved: Evaluation, tmp_path: Path
) -> None:
    slow_light = _evaluate(
        "megatron-1.7b", dp=1, tp=1, pp=8, micro_batch_size=1, global_batch_size=16
    )
    evaluations = [small, interleaved, slow_light]
    fig = plots.pareto_figure(evaluations, title="three", capacity_bytes=80 * 2**30)
    ax = fig.axes[0]
    points = [(ev.step_time_s, ev.peak_memory_bytes / 2**30) for ev in evaluations]
    front = plots.pareto_front(points)
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "Pareto front"]
    assert list(line.get_xdata()) == [points[i][0] for i in front]
    fastest = min(evaluations, key=lambda ev: ev.step_time_s)
    assert any(f"fastest: {fastest.plan.label()}" in t.get_text() for t in ax.texts)
    kwargs = {"title": "three", "capacity_bytes": 80 * 2**30}
    first = _png(plots.plot_pareto(evaluations, tmp_path / "a.png", **kwargs))
    assert first == _png(plots.plot_pareto(evaluations, tmp_path / "b.png", **kwargs))
    _png(plots.plot_pareto([], tmp_path / "empty.png", **kwargs))


# ------------------------------------------------------------------------------ CLI

SIM = [
    "simulate",
    *("--model", "megatron-1.7b", "--gpu", GPU, "--gpus", "8"),
    *("--tp", "1", "--pp", "4", "--mbs", "1", "--gbs", "16"),
]
PLAN = [
    "plan",
    *("--model", "megatron-1.7b", "--gpu", GPU, "--gpus", "4", "--gbs", "8"),
    *("--top", "3", "--simulate-top", "4"),
]


def test_simulate_writes_trace_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, gantt, memory = tmp_path / "t.json", tmp_path / "g.png", tmp_path / "m.png"
    args = ["--trace", str(trace), "--plot", str(gantt), "--memory-plot", str(memory)]
    assert main([*SIM, "--format", "json", *args]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout stays pure JSON
    assert doc["plan"]["pp"] == 4
    assert captured.err.count("plansim: wrote") == 3
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" for e in events) and any(e["ph"] == "C" for e in events)
    _png(gantt)
    _png(memory)


def test_plan_writes_pareto_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pareto.png"
    assert main([*PLAN, "--plot", str(out)]) == 0
    assert "step_time_s" in capsys.readouterr().out
    _png(out)


@pytest.mark.parametrize(
    ("command", "flag"),
    [(SIM, "--trace"), (SIM, "--plot"), (SIM, "--memory-plot"), (PLAN, "--plot")],
)
def test_unwritable_output_is_one_line_before_any_work(
    command: list[str],
    flag: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated before checking the output path")

    monkeypatch.setattr("plansim.commands.simulate.evaluate", no_work)
    monkeypatch.setattr("plansim.commands.plan_space.search", no_work)
    bad = tmp_path / "no" / "such" / "out.png"
    assert main([*command, flag, str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"plansim: error: {flag}: cannot write ") and str(bad) in err
    assert main([*command, flag, str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_rejected_plan_writes_no_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.png"
    args = ["simulate", "--model", "gpt3-175b", "--gpu", GPU, "--gpus", "8"]
    args += ["--tp", "8", "--pp", "1", "--mbs", "1", "--gbs", "8", "--plot", str(out)]
    assert main(args) == 1
    assert "--plot not written: the plan was rejected" in capsys.readouterr().err
    assert not out.exists() and os.listdir(tmp_path) == []


def test_kind_colours_are_distinct() -> None:
    compute = ("forward", "backward", "backward_input", "backward_weight", "recompute")
    colours = [plots.KIND_STYLES[k][0] for k in compute]
    comm = {plots.KIND_STYLES[k][0] for k in ("tp_comm", "send_forward", "send_backward")}
    assert len(set(colours)) == len(colours) and not comm & set(colours)
    for a, b in itertools.combinations(("send_forward", "send_backward", "dp_comm"), 2):
        assert plots.KIND_STYLES[a][0] != plots.KIND_STYLES[b][0]
