"""plansim validate: bad inputs (one line each, before any process starts), the files it
writes and --update-profile, with the run replaced by a synthetic measurement (no torch)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from plansim.cli import build_parser, main
from plansim.commands import validate as cmd
from plansim.io.profiles import list_profiles, load_profile, write_profile
from plansim.sim import timeline as tl
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan
from plansim.validate.compare import simulate_plan
from plansim.validate.result import MeasuredRun, ValidateError
from plansim.validate.run_config import RunConfig
from tests.unit.test_validate_compare import profile_with_fp32, scaled

TINY = [
    "--model",
    "gpt3-175b",
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-heads",
    "4",
    "--seq-len",
    "32",
    "--vocab-size",
    "128",
]


def args_for(profile: str, out: Path, *extra: str) -> list[str]:
    return [
        "validate",
        *TINY,
        "--tp",
        "1",
        "--pp",
        "2",
        "--mbs",
        "1",
        "--gbs",
        "4",
        "--backend",
        "gloo",
        "--nproc",
        "2",
        "--profile",
        profile,
        "--out",
        str(out),
        *extra,
    ]


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "synthetic.yaml"
    write_profile(profile_with_fp32(), path)
    return path


def fake_measure(factor: float):  # type: ignore[no-untyped-def]
    """A stand-in for the runner: the simulated step with every duration x ``factor``."""

    def measure(args: argparse.Namespace, *, model: ModelSpec, plan: ParallelPlan) -> MeasuredRun:
        ev = simulate_plan(model, plan, load_profile(args.profile), dtype=args.dtype)
        kinds = set(ev.result.timeline["kind"])
        meas = scaled(ev.result.timeline, dict.fromkeys(kinds, factor), time=factor)
        return MeasuredRun(
            model=model,
            plan=plan,
            backend=args.backend,
            device="cpu",
            num_processes=args.nproc,
            num_warmup_steps=args.warmup_steps,
            step_times_s=(factor * ev.step_time_s,) * args.steps,
            losses=(1.0,) * (args.steps + args.warmup_steps),
            timelines=(meas,) * args.steps,
            peak_memory_bytes=(1 << 20, 1 << 20),
            versions={"torch": "fake"},
        )

    return measure


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Exit status 2 (returned, or argparse's SystemExit for usage errors), one stderr line."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = int(exc.code or 0)
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_inputs_give_one_clear_line(
    tmp_path: Path, profile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    nproc = args_for(str(profile_file), out)
    nproc[nproc.index("--nproc") + 1] = "3"
    assert "--nproc(3) must equal tp(1) * pp(2) * dp(1) = 2" in one_line_error(capsys, nproc)
    backend = args_for(str(profile_file), out)
    backend[backend.index("--backend") + 1] = "mpi"
    err = one_line_error(capsys, backend)
    assert "--backend" in err and "'mpi'" in err and "gloo" in err
    missing = one_line_error(capsys, args_for(str(tmp_path / "none.yaml"), out))
    assert "none.yaml: file not found" in missing
    unknown = one_line_error(capsys, args_for("no-such-profile", out))
    assert "unknown hardware profile 'no-such-profile'" in unknown
    heads = one_line_error(capsys, [*args_for(str(profile_file), out), "--num-heads", "3"])
    assert "hidden_size(64) is not divisible by model.num_attention_heads(3)" in heads
    # fp32 and bf16 only, refused at the flag, not after start-up
    dtype = one_line_error(capsys, [*args_for(str(profile_file), out), "--dtype", "fp16"])
    assert "--dtype" in dtype and "'fp16'" in dtype and "'bf16'" in dtype
    # ZeroRedundancyOptimizer would keep every fp32 master weight on each rank
    zero1 = args_for(str(profile_file), out)
    zero1[zero1.index("--pp") + 1] = "1"
    zero1 += ["--zero", "1", "--dtype", "bf16"]
    bf16 = one_line_error(capsys, zero1)
    assert "plan.zero_stage 1 with dtype bf16" in bf16 and "or dtype fp32" in bf16
    # expert parallelism folds into the data-parallel ranks (here dp 1)
    folded = one_line_error(capsys, [*args_for(str(profile_file), out), "--ep", "2"])
    assert "plan.ep(2) * etp(1) = 2 does not divide tp(1) * cp(1) * dp(1) = 1" in folded
    assert not out.exists()  # nothing written, no process started


def test_dualpipe_is_refused_with_the_schedules_it_runs(
    tmp_path: Path, profile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DualPipe (two model copies fed from both ends) is not in torch.distributed.pipelining:
    one line naming the schedule and those the validator runs, before any process starts;
    the runner's RunConfig refuses it too."""
    out = tmp_path / "out"
    argv = [*args_for(str(profile_file), out), "--schedule", "dualpipe"]
    err = one_line_error(capsys, argv)
    assert "schedule 'dualpipe' cannot be run by the validator" in err
    assert "choose one of: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v, dualpipev" in err
    assert not out.exists()
    args = build_parser().parse_args(argv)
    args.dtype = "fp32"
    with pytest.raises(ValidateError, match="schedule 'dualpipe' cannot be run"):
        RunConfig(
            model=cmd.scaled_model(args),
            plan=cmd.plan_from_args(args),
            backend="gloo",
            device="cpu",
            num_processes=2,
            num_steps=1,
        )


def test_writes_every_output_and_refits_the_profile(
    tmp_path: Path,
    profile_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cmd, "_measure", fake_measure(1.5))
    out = tmp_path / "out"
    assert main([*args_for(str(profile_file), out), "--update-profile"]) == 0
    table = capsys.readouterr().out
    assert "step time after refit (ms)" in table
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "comparison.json",
        "events.csv",
        "measured_timeline.csv",
        "measured_trace.json",
        "overlay.png",
        "simulated_timeline.csv",
        "simulated_trace.json",
    ]
    doc = json.loads((out / "comparison.json").read_text())
    assert doc["step_time_error_pct"] == pytest.approx(100 * (1 / 1.5 - 1))
    assert doc["model"]["num_layers"] == 2 and doc["model"]["hidden_size"] == 64
    assert doc["model"]["name"] == "gpt3-175b (scaled)"
    # The synthetic profile's collective curves are one point (1 byte): pp2's sends read
    # past it, and the report says so.
    send = next(o for o in doc["out_of_range_lookups"] if o["key"] == "intra_node.sendrecv")
    assert send["queried_high"] > send["measured_high"] == 1.0
    assert "round-numbers's curves read outside their measured points" in table
    after = doc["after_refit"]
    assert abs(after["step_time_error_pct"]) < 2.0
    refitted = load_profile(str(profile_file))
    assert "refit by plansim validate" in refitted.provenance["hbm_efficiency_fraction"]
    trace = json.loads((out / "measured_trace.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])


def test_outputs_are_byte_identical_across_runs(
    tmp_path: Path, profile_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cmd, "_measure", fake_measure(1.2))
    contents = []
    for name in ("a", "b"):
        assert main(args_for(str(profile_file), tmp_path / name)) == 0
        contents.append({p.name: p.read_bytes() for p in (tmp_path / name).iterdir()})
    assert contents[0] == contents[1]


def test_a_failed_run_writes_no_profile_and_no_results(
    tmp_path: Path,
    profile_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def dies(*_: object, **__: object) -> MeasuredRun:
        raise ValidateError("rank 1 died: exit code -9 (timeout 5 s)")

    monkeypatch.setattr(cmd, "_measure", dies)
    before = profile_file.read_bytes()
    out = tmp_path / "out"
    err = one_line_error(capsys, [*args_for(str(profile_file), out), "--update-profile"])
    assert "rank 1 died" in err
    assert profile_file.read_bytes() == before
    assert list(out.iterdir()) == []


def test_validate_command_does_not_import_torch() -> None:
    code = (
        "import sys, plansim.cli, plansim.commands.validate, plansim.validate.refit\n"
        "plansim.cli.build_parser()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(
    "cpu-2core-gloo" not in list_profiles(), reason="needs hardware_profiles/cpu-2core-gloo.yaml"
)
def test_end_to_end_on_two_gloo_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real runner (torch, 2 gloo ranks, pp2 1F1B, a 2-layer 64-wide GPT): every output
    is written and consistent with the run."""
    out = tmp_path / "out"
    argv = [*args_for("cpu-2core-gloo", out), "--steps", "2", "--timeout", "120"]
    assert main(argv) == 0, capsys.readouterr().err
    assert "step time (ms)" in capsys.readouterr().out
    doc = json.loads((out / "comparison.json").read_text())
    assert doc["measured_step_time_s"] > 0 and doc["simulated_step_time_s"] > 0
    assert doc["step_time_error_pct"] == pytest.approx(
        100 * (doc["simulated_step_time_s"] / doc["measured_step_time_s"] - 1), abs=1e-6
    )
    assert doc["model"]["num_layers"] == 2 and doc["run"]["num_processes"] == 2
    assert len(doc["run"]["losses"]) == 3 and all(0 < x < 20 for x in doc["run"]["losses"])
    # 4 micro-batches x 2 stages of forward and of backward, matched one to one
    assert doc["kinds"]["forward"]["measured_count"] == 8
    assert doc["events"]["num_matched"] >= 16
    measured = pd.read_csv(out / "measured_timeline.csv")  # floats stay floats
    tl.validate_timeline(measured)
    assert sorted(set(measured["rank"])) == [0, 1]
    for name in ("overlay.png", "measured_trace.json", "simulated_trace.json", "events.csv"):
        assert (out / name).stat().st_size > 0


@pytest.mark.skipif(
    "cpu-2core-gloo" not in list_profiles(), reason="needs hardware_profiles/cpu-2core-gloo.yaml"
)
def test_bf16_run_holds_the_memory_plansim_prices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One gloo rank trains a 2-layer 128-wide GPT in bf16 mixed precision: bf16 weights, fp32
    main gradients and master weights, Adam states (18 bytes a parameter, about 540K
    parameters). Its measured peak is within 2% of the simulated one (measured -0.1%; fp32
    -0.9%); losing the main gradients or the master weights would be 15% less."""
    out = tmp_path / "out"
    argv = [
        "validate",
        "--model",
        "megatron-1.7b",
        *("--num-layers", "2", "--hidden-size", "128", "--num-heads", "4"),
        *("--seq-len", "128", "--vocab-size", "1024"),
        *("--tp", "1", "--pp", "1", "--mbs", "2", "--gbs", "4"),
        *("--backend", "gloo", "--nproc", "1", "--profile", "cpu-2core-gloo"),
        *("--dtype", "bf16", "--steps", "1", "--timeout", "120", "--out", str(out)),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    doc = json.loads((out / "comparison.json").read_text())
    assert doc["run"]["plan"]["precision"] == "bf16"
    assert all(0 < x < 20 for x in doc["run"]["losses"])
    assert abs(doc["peak_memory_bytes"]["error_pct_per_rank"][0]) < 2.0


def test_under_torchrun_only_global_rank_0_writes(
    tmp_path: Path, profile_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cmd, "_measure", fake_measure(1.0))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    before = profile_file.read_bytes()
    assert main([*args_for(str(profile_file), tmp_path / "r1"), "--update-profile"]) == 0
    assert list((tmp_path / "r1").iterdir()) == [] and profile_file.read_bytes() == before
    monkeypatch.setenv("RANK", "0")
    assert main(args_for(str(profile_file), tmp_path / "r0")) == 0
    assert (tmp_path / "r0" / "comparison.json").exists()


def test_a_failed_run_writes_failure_json_and_exits_1(
    tmp_path: Path,
    profile_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from plansim.validate.result import RunFailed

    ranks = (
        {"rank": 0, "status": "raised", "exit_status": 1, "last_progress": "step 1", "error": "x"},
        {"rank": 1, "status": "died", "exit_status": -9, "last_progress": "step 1", "error": "oom"},
    )

    def failing(*args: object, **kwargs: object) -> object:
        raise RunFailed("rank 1 died (exit status -9) without a result", ranks=ranks)

    monkeypatch.setattr(cmd, "_measure", failing)
    out = tmp_path / "out"
    assert main(args_for(str(profile_file), out)) == 1
    assert "rank 1 died" in capsys.readouterr().err
    doc = json.loads((out / "failure.json").read_text())
    assert doc["status"] == "failed" and doc["ranks"][1]["exit_status"] == -9
    assert doc["plan"].startswith("tp1 pp2")


def test_a_run_that_cannot_fit_the_hosts_memory_is_refused_before_it_starts(
    tmp_path: Path,
    profile_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import plansim.validate.preflight as preflight

    def never(*args: object, **kwargs: object) -> object:
        raise AssertionError("no rank may start")

    monkeypatch.setattr(cmd, "_measure", never)
    monkeypatch.setattr(preflight, "host_memory", lambda: (2.0**30, 2.0**20))  # 1 MiB free
    assert main(args_for(str(profile_file), tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert "the 2 ranks need about" in err and "GiB of host memory together" in err
    assert "0.0 GiB available" in err


def test_nccl_without_a_gpu_is_refused_before_launching(
    tmp_path: Path,
    profile_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def never(*args: object, **kwargs: object) -> object:
        raise AssertionError("no rank may start")

    monkeypatch.setattr(cmd, "_measure", never)
    argv = args_for(str(profile_file), tmp_path / "out")
    argv[argv.index("gloo")] = "nccl"
    assert main(argv) == 2
    assert "--backend nccl needs a CUDA device" in capsys.readouterr().err
