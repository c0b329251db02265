"""Calibration results -> profiles: building, merging, the raw CSV, import-nccl-tests and the
calibrate command's checks. Pure except the two runner tests, which import torch but launch
nothing (the measurement is replaced by synthetic rows or an interrupt)."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from plansim.calibrate.aggregate import aggregate
from plansim.calibrate.build import build_update
from plansim.calibrate.plan import build_plan, group_sizes_for
from plansim.calibrate.raw import frame, merge_raw, raw_path, read_raw, write_raw
from plansim.calibrate.run_info import RunInfo
from plansim.cli import main
from plansim.commands import calibrate as calibrate_command
from plansim.errors import InputFileError
from plansim.io.profiles import (
    ProfileUpdate,
    load_profile,
    merge_profile,
    profiles_dir,
    write_profile,
)
from plansim.specs.curves import COLLECTIVES, CollectiveCurve, Curve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"
MIB = 2**20
GIB = 2**30
TOTAL, AVAILABLE = 16 * GIB, 12 * GIB
#: synthetic machine: GEMM FLOP/s per dtype, stream bytes/s, collective alpha and busbw
RATES = {"fp32": 50e9, "bf16": 20e9, "fp16": 1e9}
STREAM = {"copy": 8e9, "add": 10e9}
ALPHA_S, BUSBW = 300e-6, 1e9
MESSAGES = (64, 1024, 16384, 262144, MIB, 4 * MIB, 16 * MIB, 32 * MIB)


def _row(
    kind: str, op: str, dtype: str, shape: str, work: float, unit: str, **kw: Any
) -> dict[str, Any]:
    time_s = kw.pop("time_s", math.nan)
    return {
        "kind": kind,
        "op": op,
        "dtype": dtype,
        "shape": shape,
        "group_size": kw.pop("group_size", 1),
        "work": work,
        "work_unit": unit,
        "rank": kw.pop("rank", 0),
        "status": kw.pop("status", "ok"),
        "reps": 3,
        "inner": 1,
        "median_s": time_s,
        "min_s": time_s,
        "max_s": time_s,
        "note": "",
    }


def synthetic_rows(
    dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16"),
    collectives: tuple[str, ...] = COLLECTIVES,
) -> list[dict[str, Any]]:
    """Rows two ranks would write for the synthetic machine (rank 1 is 1% slower)."""
    rows: list[dict[str, Any]] = []
    for rank, slow in ((0, 1.0), (1, 1.01)):
        rows.append(_row("memory", "rss_after_init", "", "1", 300 * MIB, "byte", rank=rank))
        for dtype in dtypes:
            for n in (64, 128, 256, 512):
                flops = 2.0 * n * 4 * n * n
                rows.append(
                    _row(
                        "gemm",
                        "mlp_up",
                        dtype,
                        f"{n}x{4 * n}x{n}",
                        flops,
                        "flop",
                        rank=rank,
                        time_s=flops / RATES[dtype] * slow,
                    )
                )
        n = 1 << 24
        for op, rate in STREAM.items():
            work = (2 if op == "copy" else 3) * 4.0 * n
            rows.append(
                _row("stream", op, "fp32", str(n), work, "byte", rank=rank, time_s=work / rate)
            )
        rows.append(_row("launch", "tiny_add", "fp32", "1", 1.0, "call", rank=rank, time_s=3e-6))
        rows.append(
            _row("adam", "adam", "fp32", "1048576", 2.0**20, "param", rank=rank, time_s=0.02)
        )
        rows.append(
            _row(
                "attention", "sdpa_fwd", "fp32", "1x4x256x64", 3.4e7, "flop", rank=rank, time_s=1e-3
            )
        )
        for name in collectives:
            factor = 2.0 * 1 / 2 if name == "all_reduce" else (0.5 if name != "sendrecv" else 1.0)
            for size in MESSAGES:
                time_s = (ALPHA_S + size * factor / BUSBW) * slow
                rows.append(
                    _row(
                        "collective",
                        name,
                        "fp32",
                        str(size),
                        float(size),
                        "byte",
                        rank=rank,
                        group_size=2,
                        time_s=time_s,
                    )
                )
    rows.append(_row("gemm", "logits", "fp16", "1024x8192x1024", 1.7e10, "flop", status="skipped"))
    return rows


def _info(run_id: str = "20250101T000000.000Z", raw_file: str = "cpu-test.raw.csv") -> RunInfo:
    return RunInfo(
        run_id=run_id,
        date="2025-01-01",
        backend="gloo",
        device="cpu",
        nproc=2,
        quick=True,
        raw_file=raw_file,
        env={"torch": "2.13.0+cpu", "device_name": "Test CPU", "cpu_count": "2"},
        host_memory_total_bytes=TOTAL,
        host_memory_available_bytes=AVAILABLE,
        load_average=(0.1, 2.0),
    )


def _built_profile(rows: list[dict[str, Any]] | None = None) -> Any:
    table = frame(rows or synthetic_rows(), run_id="20250101T000000.000Z")
    built = build_update(table, _info(), base=None, name="cpu-test")
    return built, merge_profile(None, built.update)


# --------------------------------------------------------------------------- building
def test_aggregate_takes_median_for_compute_and_slowest_rank_for_collectives() -> None:
    table = aggregate(frame(synthetic_rows(), run_id="r"))
    gemm = table[(table["kind"] == "gemm") & (table["dtype"] == "fp32")].iloc[0]
    assert gemm["time_s"] == pytest.approx(gemm["work"] / 50e9 * 1.005)
    assert gemm["num_ranks"] == 2
    coll = table[(table["op"] == "all_reduce") & (table["shape"] == str(MIB))].iloc[0]
    assert coll["time_s"] == pytest.approx((ALPHA_S + MIB / BUSBW) * 1.01)
    assert "skipped" not in set(table["kind"]) and len(table[table["kind"] == "memory"]) == 0


def test_cpu_mapping_gives_every_profile_field_with_provenance() -> None:
    built, profile = _built_profile()
    assert profile.name == "cpu-test" and profile.gpus_per_node == 2
    assert profile.peak_flops_per_s["fp32"] == pytest.approx(50e9 * 1 / 1.005)
    assert profile.matmul_flops_per_s("bf16", 2.0 * 256**3 * 4) == pytest.approx(20e9 / 1.005)
    assert profile.hbm_bytes_per_s == pytest.approx(10e9)  # the best kernel: add
    assert profile.hbm_efficiency_fraction == pytest.approx(1.0)
    assert profile.pcie_bytes_per_s == pytest.approx(8e9 / 2)  # bytes copied per second
    assert profile.kernel_launch_s == pytest.approx(3e-6)
    assert profile.hbm_capacity_bytes == pytest.approx(TOTAL / 2)
    reserve = 300 * MIB + (TOTAL - AVAILABLE) / 2 + 0.05 * TOTAL / 2
    assert profile.memory_reserve_bytes == pytest.approx(reserve)
    for name in COLLECTIVES:
        curve = profile.intra_node[name]
        factor = {"all_reduce": 1.0, "sendrecv": 1.0}.get(name, 0.5)
        for size in MESSAGES[-3:]:
            expected = (ALPHA_S + size * factor / BUSBW) * 1.01
            assert curve.time_s(size, 2) == pytest.approx(expected, rel=1e-6)
    assert profile.nic_bytes_per_s == pytest.approx(BUSBW, rel=0.01)
    assert profile.nic_latency_s == pytest.approx(ALPHA_S * 1.01, rel=0.01)
    for key, source in profile.provenance.items():
        assert source.startswith("measured: Test CPU, 2025-01-01, torch 2.13.0+cpu, gloo"), key
        assert "raw: cpu-test.raw.csv run 20250101T000000.000Z" in source, key
    assert "NOT a NIC" in profile.provenance["nic_gb_per_s"]
    labels = [label for label, _ in built.summary]
    assert "attention sdpa_fwd fp32 best" in labels and "host Adam step 1048576 params" in labels


def test_compute_timings_without_a_whole_core_are_counted_and_cited() -> None:
    rows = synthetic_rows()
    gemms = [r for r in rows if r["kind"] == "gemm" and r["status"] == "ok"]
    for i, row in enumerate(gemms):
        row["cpu_share"] = 0.5 if i < 3 else 0.99
    built, profile = _built_profile(rows)
    assert (built.contended, built.timed) == (3, len(gemms))
    assert (
        f"3 of {len(gemms)} compute timings had < 90% of a core"
        in (profile.provenance["matmul_efficiency.fp32"])
    )
    assert "compute timings" not in profile.provenance["intra_node.all_reduce"]


def test_provenance_says_how_gemms_met_the_caches() -> None:
    _, profile = _built_profile()
    assert (
        "calls timed back to back (operands stay cached)"
        in (profile.provenance["matmul_efficiency.fp32"])
    )
    rows = synthetic_rows()
    cold = "each call timed alone after a cache-evicting write of 72 MiB"
    for row in rows:
        if row["kind"] in ("gemm", "attention") and row["status"] == "ok":
            row["note"] = cold
    _, profile = _built_profile(rows)
    assert profile.provenance["matmul_efficiency.fp32"].endswith(cold)


def test_datasheet_peak_of_the_base_is_kept_and_fractions_follow_it() -> None:
    base = load_profile("h100-sxm5-80gb")
    table = frame(synthetic_rows(dtypes=("bf16",), collectives=()), run_id="r")
    built = build_update(table, _info(), base=base, name=base.name)
    assert "bf16" not in built.update.peak_flops_per_s  # 989 TFLOP/s datasheet >= measured
    merged = merge_profile(base, built.update)
    assert merged.peak_flops_per_s["bf16"] == base.peak_flops_per_s["bf16"]
    assert merged.matmul_flops_per_s("bf16", 2.0 * 256**3 * 4) == pytest.approx(20e9 / 1.005)
    assert merged.provenance["peak_tflops.bf16"] == base.provenance["peak_tflops.bf16"]


def test_a_gemm_dtype_measured_at_one_size_keeps_the_base_curve() -> None:
    """The larger GEMMs of a dtype skipped (an H100's first fp16 call paid kernel loading):
    the one small GEMM left must not become the dtype's curve for every size."""
    base = load_profile("h100-sxm5-80gb")
    rows = [
        r
        for r in synthetic_rows(dtypes=("bf16", "fp16"), collectives=())
        if r["dtype"] != "fp16" or r["shape"] == "64x256x64"
    ]
    built = build_update(frame(rows, run_id="r"), _info(), base=base, name=base.name)
    assert "fp16" not in built.update.matmul_efficiency and "bf16" in built.update.matmul_efficiency
    assert dict(built.summary)["GEMM fp16"].startswith("not written: measured at 1 size")
    merged = merge_profile(base, built.update)
    assert merged.matmul_efficiency["fp16"] == base.matmul_efficiency["fp16"]
    assert merged.provenance["matmul_efficiency.fp16"] == base.provenance["matmul_efficiency.fp16"]


# --------------------------------------------------------------------------- merging
def test_merge_replaces_only_what_was_measured_and_keeps_provenance() -> None:
    base = load_profile("h100-sxm5-80gb")
    curve = CollectiveCurve(
        collective="all_reduce", latency_s=20e-6, busbw_bytes_per_s=Curve(x=(1e6,), y=(100e9,))
    )
    update = ProfileUpdate(
        intra_node={"all_reduce": curve},
        scalars={"kernel_launch_s": 4e-6},
        provenance={
            "intra_node.all_reduce": "measured: test",
            "intra_node.all_reduce.latency_us": "measured: test",
            "kernel_launch_us": "measured: test",
        },
    )
    merged = merge_profile(base, update)
    assert merged.intra_node["all_reduce"] == curve and merged.kernel_launch_s == 4e-6
    for name in ("all_gather", "reduce_scatter", "sendrecv"):
        assert merged.intra_node[name] == base.intra_node[name]
    assert merged.peak_flops_per_s == base.peak_flops_per_s
    assert merged.matmul_efficiency == base.matmul_efficiency
    assert (merged.name, merged.description, merged.nic_bytes_per_s) == (
        base.name,
        base.description,
        base.nic_bytes_per_s,
    )
    changed = {k for k in base.provenance if merged.provenance[k] != base.provenance[k]}
    assert changed == {
        "intra_node.all_reduce",
        "intra_node.all_reduce.latency_us",
        "kernel_launch_us",
    }


def test_merge_refuses_numbers_without_source_or_an_incomplete_new_profile() -> None:
    with pytest.raises(InputFileError, match="no source for: kernel_launch_us"):
        merge_profile(
            load_profile("a100-sxm4-40gb"), ProfileUpdate(scalars={"kernel_launch_s": 1e-6})
        )
    with pytest.raises(InputFileError, match="cannot create a profile"):
        merge_profile(None, ProfileUpdate(name="x", provenance={}))
    with pytest.raises(InputFileError, match="unknown scalar"):
        merge_profile(None, ProfileUpdate(scalars={"hbm_gib": 1.0}))


# --------------------------------------------------------------------------- raw CSV
def test_raw_csv_round_trip_and_merge_keeps_cited_runs(tmp_path: Path) -> None:
    old = pd.concat(
        [frame(synthetic_rows()[:3], run_id="run-a"), frame(synthetic_rows()[:2], run_id="run-b")]
    )
    new = frame(synthetic_rows()[:4], run_id="run-c")
    merged = merge_raw(old, new, keep_runs={"run-a", "run-c"})
    assert list(merged["run_id"].unique()) == ["run-a", "run-c"]
    path = raw_path(tmp_path / "cpu.yaml")
    assert path.name == "cpu.raw.csv"
    write_raw(merged, path)
    back = read_raw(path)
    assert len(back) == 7 and back["median_s"].dtype == float
    assert back.loc[0, "dtype"] == "" and back.loc[0, "shape"] == "1"
    assert read_raw(tmp_path / "none.raw.csv").empty
    (tmp_path / "bad.raw.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InputFileError, match="not a raw-measurement CSV"):
        read_raw(tmp_path / "bad.raw.csv")


# --------------------------------------------------------------------------- calibrate runner
def _fake_run(rows: list[dict[str, Any]]) -> Any:
    def run_items(*args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
        return rows, {"torch": "2.13.0+cpu", "device_name": "Test CPU", "cpu_count": "2"}

    return run_items


def _two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's core check sees two cores, whatever this machine has."""
    monkeypatch.setattr(calibrate_command.os, "sched_getaffinity", lambda pid: {0, 1})


def test_one_rank_cannot_make_a_new_profile_and_measures_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = pytest.importorskip("plansim.calibrate.runner")

    def must_not_run(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("measured before refusing")

    monkeypatch.setattr(runner, "run_items", must_not_run)
    out = tmp_path / "one.yaml"
    assert main(["calibrate", "--backend", "gloo", "--nproc", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--nproc 1 times no collectives" in err and "merge it into an existing" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_one_rank_merges_keeping_the_base_collectives_and_node_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One GPU of an 8-GPU node calibrated on a one-GPU machine: its compute replaces the
    base's, the base's NVLink curves and 8 GPUs per node stay."""
    runner = pytest.importorskip("plansim.calibrate.runner")
    out = tmp_path / "h100-one.yaml"
    shutil.copy(profiles_dir() / "h100-sxm5-80gb.yaml", out)
    base = load_profile(str(out))
    monkeypatch.setattr(runner, "run_items", _fake_run(synthetic_rows(collectives=())))
    command = ["calibrate", "--backend", "gloo", "--nproc", "1", "--out", str(out), "--quick"]
    assert main(command) == 0
    assert "merged into h100-one.yaml" in capsys.readouterr().out
    merged = load_profile(str(out))
    assert merged.gpus_per_node == base.gpus_per_node == 8
    assert merged.intra_node == base.intra_node and merged.nic_bytes_per_s == base.nic_bytes_per_s
    for key in ("gpus_per_node", "intra_node.all_reduce", "nic_gb_per_s"):
        assert merged.provenance[key] == base.provenance[key]
    assert merged.matmul_efficiency["fp32"] != base.matmul_efficiency.get("fp32")
    assert merged.provenance["kernel_launch_us"].startswith("measured: ")


def test_one_rank_plans_no_collective() -> None:
    for quick in (True, False):
        assert group_sizes_for(1, quick=quick) == ()
        plan = build_plan(nproc=1, device="cpu", quick=quick)
        assert plan.group_sizes == () and not [i for i in plan.items if i.kind == "collective"]
        two = build_plan(nproc=2, device="cpu", quick=quick)
        assert two.group_sizes == (2,) and [i for i in two.items if i.kind == "collective"]


def test_calibrating_into_an_existing_profile_keeps_its_other_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = pytest.importorskip("plansim.calibrate.runner")
    out = tmp_path / "cpu-test.yaml"
    command = ["calibrate", "--backend", "gloo", "--nproc", "2", "--out", str(out), "--quick"]
    _two_cores(monkeypatch)
    monkeypatch.setattr(runner, "run_items", _fake_run(synthetic_rows()))
    assert main(command) == 0
    first = load_profile(str(out))
    first_raw = read_raw(raw_path(out))
    # second run measures only fp32 GEMMs and all_reduce
    monkeypatch.setattr(
        runner,
        "run_items",
        _fake_run(synthetic_rows(dtypes=("fp32",), collectives=("all_reduce",))),
    )
    assert main(command) == 0
    second = load_profile(str(out))
    assert set(second.matmul_efficiency) == {"fp32", "bf16", "fp16"}
    for key in ("matmul_efficiency.bf16", "peak_tflops.fp16", "intra_node.sendrecv"):
        assert second.provenance[key] == first.provenance[key]
    assert second.provenance["matmul_efficiency.fp32"] != first.provenance["matmul_efficiency.fp32"]
    assert second.intra_node["all_gather"] == first.intra_node["all_gather"]
    raw = read_raw(raw_path(out))
    assert raw["run_id"].nunique() == 2 and len(raw) > len(first_raw)
    text = out.read_text()
    assert str(tmp_path) not in text and str(Path.cwd()) not in text
    assert "wrote cpu-test.yaml" in capsys.readouterr().out


def test_an_interrupted_run_leaves_the_old_files_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = pytest.importorskip("plansim.calibrate.runner")
    out = tmp_path / "cpu-test.yaml"
    _, profile = _built_profile()
    write_profile(profile, out)
    write_raw(frame(synthetic_rows(), run_id="20250101T000000.000Z"), raw_path(out))
    before = (out.read_bytes(), raw_path(out).read_bytes())

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_items", interrupted)
    # Ctrl-C: one line and status 130 (what a shell reports for SIGINT), no traceback
    assert main(["calibrate", "--backend", "gloo", "--nproc", "1", "--out", str(out)]) == 130
    monkeypatch.setattr(runner, "run_items", _fake_run(synthetic_rows()))

    def failing_write(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(runner, "write_raw", failing_write)
    with pytest.raises(OSError, match="disk full"):
        main(["calibrate", "--backend", "gloo", "--nproc", "1", "--out", str(out)])
    assert (out.read_bytes(), raw_path(out).read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu-test.raw.csv", "cpu-test.yaml"]


# --------------------------------------------------------------------------- command checks
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "gloo", "--nproc", "4096"], "--nproc 4096 is larger than the"),
        (["--backend", "gloo", "--nproc", "0"], "--nproc must be at least 1"),
        (["--backend", "nccl", "--device", "cpu", "--nproc", "1"], "needs --device cuda"),
    ],
)
def test_calibrate_rejects_bad_input_with_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", *args, "--out", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.yaml").exists()


def test_calibrate_rejects_an_unknown_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "--backend", "mpi", "--nproc", "2", "--out", str(tmp_path / "x.yaml")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "invalid choice: 'mpi'" in err and len(err.splitlines()) == 1


def test_calibrate_rejects_an_unwritable_or_unreadable_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["calibrate", "--backend", "gloo", "--nproc", "1", "--out"]
    blocker = tmp_path / "file"
    blocker.write_text("")
    cases = {
        str(tmp_path / "missing" / "x.yaml"): "does not exist",
        str(blocker / "x.yaml"): "does not exist",
        str(tmp_path / "x.txt"): "must end in .yaml",
        str(tmp_path): "must end in .yaml",
    }
    if Path("/proc/self").is_dir():
        cases["/proc/plansim-calibrate-test.yaml"] = "cannot write in /proc"
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\n")
    cases[str(bad)] = "bad.yaml: name: missing required key"
    for out, message in cases.items():
        assert main([*base, out]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (out, err)


def test_cli_modules_do_not_import_torch() -> None:
    code = (
        "import sys, plansim.cli\n"
        "import plansim.calibrate.fit, plansim.calibrate.nccl_tests, plansim.calibrate.build\n"
        "import plansim.calibrate.importer, plansim.calibrate.raw, plansim.calibrate.plan\n"
        "import plansim.calibrate.progress, plansim.commands.calibrate\n"
        "plansim.cli.build_parser()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- import-nccl-tests
def _copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / f"{name}.yaml"
    shutil.copy(profiles_dir() / f"{name}.yaml", target)
    return target


def test_import_nccl_tests_intra_node_replaces_only_the_collectives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _copy("h100-sxm5-80gb", tmp_path)
    base = load_profile(str(path))
    logs = [
        FIXTURES / "all_reduce_perf_n01_h100_1node.log",
        FIXTURES / "sendrecv_perf_n03_a100.log",
    ]
    assert main(["profiles", "import-nccl-tests", *map(str, logs), "--into", str(path)]) == 0
    out = capsys.readouterr().out
    assert "intra_node.all_reduce <- all_reduce_perf_n01_h100_1node.log" in out
    merged = load_profile(str(path))
    curve = merged.intra_node["all_reduce"]
    assert curve.latency_s == pytest.approx(13.0e-6)
    # every size whose bandwidth term is visible is reproduced (C0028: 4016.4 us at 1 GiB)
    assert curve.time_s(GIB, 8) == pytest.approx(4016.4e-6, rel=1e-6)
    assert merged.intra_node["sendrecv"].time_s(GIB, 8) == pytest.approx(5490.5e-6, rel=1e-6)
    assert merged.intra_node["all_gather"] == base.intra_node["all_gather"]
    assert merged.peak_flops_per_s == base.peak_flops_per_s
    assert merged.nic_bytes_per_s == base.nic_bytes_per_s
    source = merged.provenance["intra_node.all_reduce"]
    assert source.startswith("nccl-tests: all_reduce_perf_n01_h100_1node.log lines 17-48")
    assert "8 ranks on 1 node(s)" in source and str(FIXTURES) not in source


def test_import_nccl_tests_inter_node_fits_the_nic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _copy("h100-sxm5-80gb", tmp_path)
    log = str(FIXTURES / "all_reduce_perf_n02_h100_2nodes.log")
    assert (
        main(["profiles", "import-nccl-tests", log, "--into", str(path), "--tier", "inter-node"])
        == 0
    )
    merged = load_profile(str(path))
    # C0063: 8 GiB in 47535 us over 16 ranks: busbw of the bandwidth term / 8 ranks per node
    alpha = merged.provenance["nic_latency_us"]
    assert "ceil(log2(2 nodes))" in alpha
    expected_nic = 8 * GIB * 2 * 15 / 16 / (47535e-6 - (merged.nic_latency_s + 13e-6)) / 8
    assert merged.nic_bytes_per_s == pytest.approx(expected_nic, rel=1e-6)
    assert 100e-6 < merged.nic_latency_s < 123e-6
    assert merged.intra_node == load_profile("h100-sxm5-80gb").intra_node
    assert "nic_gb_per_s = 42.4" in capsys.readouterr().out


def test_import_nccl_tests_reports_bad_lines_and_dry_run_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _copy("h100-sxm5-80gb", tmp_path)
    before = path.read_bytes()
    logs = [
        str(FIXTURES / "reduce_scatter_perf_n04_h100_truncated.log"),
        str(FIXTURES / "nccl_tests_sweep_h200_synthetic.log"),
    ]
    argv = ["profiles", "import-nccl-tests", *logs, "--into", str(path), "--dry-run"]
    assert main(argv) == 2  # the H200 log does not fit the H100 profile
    assert "ran on NVIDIA H200" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0
    captured = capsys.readouterr()
    assert path.read_bytes() == before
    assert yaml.safe_load(captured.out)["name"] == "h100-sxm5-80gb"
    assert "reduce_scatter_perf_n04_h100_truncated.log:24: incomplete row" in captured.err
    assert "would update h100-sxm5-80gb.yaml" in captured.err


@pytest.mark.parametrize(
    ("log", "extra", "message"),
    [
        ("not_nccl_tests.log", [], "no nccl-tests results"),
        (
            "all_reduce_perf_n02_h100_2nodes.log",
            [],
            "spans 2 nodes; import it with --tier inter-node",
        ),
        (
            "all_reduce_perf_n01_h100_1node.log",
            ["--tier", "inter-node"],
            "needs a run over at least 2",
        ),
        ("missing.log", [], "missing.log: file not found"),
    ],
)
def test_import_nccl_tests_errors_are_one_line(
    log: str, extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _copy("h100-sxm5-80gb", tmp_path)
    before = path.read_bytes()
    assert (
        main(["profiles", "import-nccl-tests", str(FIXTURES / log), "--into", str(path), *extra])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert path.read_bytes() == before


def test_import_nccl_tests_into_a_missing_profile(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = str(FIXTURES / "all_reduce_perf_n01_h100_1node.log")
    assert main(["profiles", "import-nccl-tests", log, "--into", str(tmp_path / "no.yaml")]) == 2
    assert "file not found; import-nccl-tests merges into an existing" in capsys.readouterr().err
    assert main(["profiles", "import-nccl-tests", log, "--into", "no-such-gpu"]) == 2
    assert "unknown hardware profile 'no-such-gpu'" in capsys.readouterr().err


def test_profiles_show_and_gpu_options_take_a_name_or_a_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _copy("a100-sxm4-80gb", tmp_path)
    assert main(["profiles", "show", "a100-sxm4-80gb"]) == 0
    by_name = capsys.readouterr().out
    assert main(["profiles", "show", str(path)]) == 0
    assert capsys.readouterr().out == by_name
    simulate = ["simulate", "--model", "gpt3-175b", "--gpus", "1024", "--tp", "8", "--pp", "16"]
    simulate += ["--mbs", "1", "--gbs", "1536", "--format", "json"]
    assert main([*simulate, "--gpu", str(path)]) == 0
    by_path = capsys.readouterr().out
    assert main([*simulate, "--profile", "a100-sxm4-80gb"]) == 0
    assert capsys.readouterr().out == by_path
