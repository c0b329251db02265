"""Launching ranks (bounded, killed on overrun, failures named) and one end-to-end
``plansim calibrate --quick`` on this machine (marked slow; it asserts structure, not timings).
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from plansim.calibrate.progress import Progress
from plansim.calibrate.raw import raw_path, read_raw
from plansim.cli import main
from plansim.io.profiles import load_profile
from plansim.specs.curves import KNOWN_COLLECTIVES


def _fail_on_rank_one(rank: int, world: int, queue: Any) -> None:
    queue.put((0, f"rank {rank} of {world} started"))
    if rank == 1:
        raise ValueError("boom on purpose")


def _sleep(rank: int, world: int, queue: Any) -> None:
    time.sleep(600)


def test_a_failing_rank_is_named() -> None:
    launch = pytest.importorskip("plansim.calibrate.launch")
    from plansim.calibrate import CalibrationError

    seen: list[str] = []
    with pytest.raises(CalibrationError, match=r"rank 1 failed: ValueError: boom on purpose"):
        launch.launch(
            _fail_on_rank_one,
            nproc=2,
            args=(),
            timeout_s=120,
            on_progress=lambda index, label: seen.append(label),
        )


def test_an_overrun_kills_every_rank_and_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = pytest.importorskip("plansim.calibrate.launch")
    from plansim.calibrate import CalibrationError

    contexts: list[Any] = []
    start = launch.mp.start_processes

    def recording(*args: Any, **kwargs: Any) -> Any:
        contexts.append(start(*args, **kwargs))
        return contexts[-1]

    monkeypatch.setattr(launch.mp, "start_processes", recording)
    began = time.monotonic()
    with pytest.raises(CalibrationError, match=r"rank\(s\) 0, 1 still running after 1.5 s"):
        launch.launch(_sleep, nproc=2, args=(), timeout_s=1.5)
    assert time.monotonic() - began < 30
    assert not any(p.is_alive() for p in contexts[0].processes)


def test_progress_is_off_without_a_terminal_and_has_a_plain_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    with Progress(4, enabled=False, stream=stream) as bar:
        bar.update(1, "gemm fp32")
    assert stream.getvalue() == ""
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if tqdm were not installed
    with Progress(4, enabled=True, stream=stream) as bar:
        bar.update(0, "gemm fp32 64x64x64")
        bar.update(2, "collective all_reduce")
    text = stream.getvalue()
    assert "[0/4] gemm fp32 64x64x64" in text and "[2/4] collective all_reduce" in text
    assert "ETA" in text and text.endswith("\n")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@pytest.mark.slow
@pytest.mark.skipif(_cores() < 2, reason="needs 2 CPU cores (one rank each)")
def test_calibrate_quick_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "cpu-e2e.yaml"
    command = ["calibrate", "--backend", "gloo", "--nproc", "2", "--quick", "--out", str(out)]
    # a 2-core CI machine takes 200-250 s for this run: the hang guard must not be what fails
    command += ["--timeout", "1200"]
    assert main(command) == 0
    assert "wrote cpu-e2e.yaml and cpu-e2e.raw.csv" in capsys.readouterr().out
    profile = load_profile(str(out))
    assert profile.name == "cpu-e2e" and profile.gpus_per_node == 2
    assert {"fp32", "bf16", "fp16"} <= set(profile.matmul_efficiency)
    assert set(profile.intra_node) == set(KNOWN_COLLECTIVES)
    assert all(source.startswith("measured: ") for source in profile.provenance.values())
    text = out.read_text(encoding="utf-8")
    assert str(tmp_path) not in text and str(Path.cwd()) not in text
    raw = read_raw(raw_path(out))
    assert raw["run_id"].nunique() == 1
    comm = raw[(raw["kind"] == "collective") & (raw["status"] == "ok")]
    assert set(comm["rank"]) == {0, 1} and set(comm["op"]) == set(KNOWN_COLLECTIVES)
    assert (comm["median_s"] > 0).all()
    assert 16 * 2**20 in set(comm["work"])
    # the measured compute terms of this run: cold-cache GEMMs, the layer's elementwise rate,
    # host overheads including DTensor over both ranks and FSDP2 units
    assert "cache-evicting write" in profile.provenance["matmul_efficiency.fp32"]
    assert profile.elementwise_forward_bytes_per_s > 0
    assert profile.elementwise_backward_bytes_per_s > 0
    host = profile.host_overhead
    assert host is not None and host.serial
    assert host.dtensor_all_reduce_forward_s is not None and host.fsdp_unit_forward_s is not None
    assert host.pipeline_action_forward_s is not None  # torch.distributed.pipelining ran
    pipeline = raw[(raw["kind"] == "host_op") & raw["op"].str.startswith("pipeline_")]
    assert set(pipeline["rank"]) == {0, 1} and (pipeline["status"] == "ok").all()
    # every pass times GEMMs: a size over the time limit skips only the larger ones, in each pass
    gemm = raw[(raw["kind"] == "gemm") & (raw["status"] == "ok")]
    assert set(gemm["sweep"]) == {0, 1, 2}
    skips = raw[(raw["kind"] == "gemm") & (raw["status"] == "skipped")]
    for (sweep, dtype), timed in gemm.groupby(["sweep", "dtype"]):
        skipped = skips[(skips["sweep"] == sweep) & (skips["dtype"] == dtype)]
        assert skipped.empty or skipped["work"].min() >= timed["work"].max()
