"""A whole training run: ramp, failure, facility and price inputs; time to train, goodput,
energy and cost of a layout; the ``--tokens`` CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from plansim.analytic.goodput import expected_wall_s
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import InputFileError, SpecError
from plansim.io.profiles import load_profile
from plansim.io.run_files import read_facility, read_failures, read_prices, read_ramp
from plansim.planner.evaluate import Rejected
from plansim.planner.training_run import RunEstimate, estimate_run
from plansim.specs.facility import Facility, PriceTable
from plansim.specs.failure_model import FailureModel
from plansim.specs.plan import plan_from_fields
from plansim.specs.training_run import RampPhase, TrainingRun, rampup_phases, steps_in_phase

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "runs"


# ------------------------------------------------------------------------- run spec
def test_a_ramp_must_end_at_the_runs_token_count() -> None:
    short = (
        RampPhase(global_batch_size=8, until_tokens=1e6),
        RampPhase(global_batch_size=16, until_tokens=2e6),
    )
    with pytest.raises(SpecError, match=r"ramp.phases\[1\].until_tokens=2e\+06 .* tokens=3e\+06"):
        TrainingRun(tokens=3e6, phases=short)
    with pytest.raises(SpecError, match=r"phases\[0\].until_tokens is missing"):
        TrainingRun(
            tokens=3e6, phases=(RampPhase(global_batch_size=8), RampPhase(global_batch_size=16))
        )
    with pytest.raises(SpecError, match="increasing order"):
        TrainingRun(
            tokens=3e6,
            phases=(
                RampPhase(global_batch_size=8, until_tokens=2e6),
                RampPhase(global_batch_size=8, until_tokens=1e6),
                RampPhase(global_batch_size=8),
            ),
        )
    run = TrainingRun(tokens=3e6, phases=(*short, RampPhase(global_batch_size=32)))
    assert run.phase_tokens() == (1e6, 1e6, 1e6)


def test_megatron_rampup_grows_the_batch_every_equal_share_of_samples() -> None:
    # --rampup-batch-size 32 32 300 with --global-batch-size 128: 3 increments of 100 samples
    phases = rampup_phases(
        start_global_batch_size=32,
        batch_size_increment=32,
        rampup_samples=300,
        global_batch_size=128,
        seq_length=10,
    )
    assert [(p.global_batch_size, p.until_tokens) for p in phases] == [
        (32, 1000.0),
        (64, 2000.0),
        (96, 3000.0),
    ]
    with pytest.raises(SpecError, match="multiple of the increment"):
        rampup_phases(
            start_global_batch_size=32,
            batch_size_increment=30,
            rampup_samples=300,
            global_batch_size=128,
            seq_length=10,
        )


def test_steps_are_whole_and_cover_the_phase() -> None:
    assert steps_in_phase(1000.0, global_batch_size=4, seq_length=25) == 10
    assert steps_in_phase(1001.0, global_batch_size=4, seq_length=25) == 11


# ------------------------------------------------------------------------- files
def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "in.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_files_read() -> None:
    llama = read_ramp(EXAMPLES / "llama3-405b-ramp.yaml", tokens=15.6e12, seq_length=8192)
    assert [p.global_batch_size for p in llama.phases] == [1024, 1024, 2048]
    assert llama.phases[0].seq_length == 4096 and llama.phases[1].seq_length is None
    deepseek = read_ramp(EXAMPLES / "deepseek-v3-ramp.yaml", tokens=14.8e12, seq_length=4096)
    assert [p.global_batch_size for p in deepseek.phases] == [3072 + 1536 * k for k in range(9)]
    assert deepseek.phases[-2].until_tokens == pytest.approx(469e9, rel=1e-6)
    failures = read_failures(EXAMPLES / "llama3-405b-failures.yaml")
    assert failures.restart_s == 600.0 and failures.checkpoint_write_bytes_per_s == 2e12
    # Llama 3: 419 interruptions in 54 days on 16,384 GPUs, one every ~3.1 hours
    assert failures.mtbf_s(16384) / 3600 == pytest.approx(54 * 24 / 419, rel=0.01)
    assert read_prices(EXAMPLES / "prices.example.yaml").gpu_hour_usd("h100-sxm5-80gb") == 2.0
    assert read_facility(EXAMPLES / "facility.example.yaml").pue == 1.1


@pytest.mark.parametrize(
    ("reader", "text", "match"),
    [
        (
            read_prices,
            "usd_per_gpu_hour: {h100-sxm5-80gb: -2}\n",
            "usd_per_gpu_hour.h100-sxm5-80gb",
        ),
        (read_prices, "usd_per_gpu_hour: 2\n", "a mapping of hardware profile name"),
        (
            read_failures,
            "interruptions_per_gpu_hour: 1e-5\nrestart_min: 5\ncheckpoint_write_gb_per_s: 0\n",
            "checkpoint_write_bytes_per_s must be a finite number > 0",
        ),
        (read_failures, "interruptions_per_gpu_hour: 1e-5\nrestart_min: 5\n", "missing key"),
        (read_facility, "pue: 0.9\nhost_power_w_per_node: 0\nnetwork_power_w_per_gpu: 0\n", "pue"),
        (read_facility, "pue: 1.2\nhost_w: 3\n", "unknown key.*host_w"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, reader: object, text: str, match: str) -> None:
    with pytest.raises(InputFileError, match=match):
        reader(_write(tmp_path, text))  # type: ignore[operator]


def test_a_ramp_file_that_stops_short_names_the_phase(tmp_path: Path) -> None:
    path = _write(tmp_path, "phases:\n  - {until_tokens: 1e9, global_batch_size: 8}\n")
    with pytest.raises(InputFileError, match=r"phases\[0\].until_tokens.*must end at the run"):
        read_ramp(path, tokens=2e9, seq_length=2048)
    both = _write(tmp_path, "phases: []\nrampup_batch_size: [1, 1, 1]\n")
    with pytest.raises(InputFileError, match="either phases"):
        read_ramp(both, tokens=2e9, seq_length=2048)


# ------------------------------------------------------------------------- estimate
MODEL = resolve_model("megatron-1.7b")
PROFILE = load_profile("h100-sxm5-80gb")


def _plan(gbs: int = 64) -> object:
    return plan_from_fields(tp=2, pp=2, dp=2, micro_batch_size=4, global_batch_size=gbs)


def _estimate(**kwargs: object) -> RunEstimate:
    run = kwargs.pop("run", TrainingRun(tokens=1e9, phases=(RampPhase(global_batch_size=64),)))
    est = estimate_run(MODEL, _plan(), PROFILE, run, **kwargs)  # type: ignore[arg-type]
    assert isinstance(est, RunEstimate)
    return est


def test_failure_free_time_energy_and_cost_follow_the_simulated_step() -> None:
    prices = PriceTable(usd_per_gpu_hour={"h100-sxm5-80gb": 3.0}, usd_per_kwh=0.1)
    facility = Facility(pue=1.5, host_power_w_per_node=1000.0, network_power_w_per_gpu=20.0)
    est = _estimate(prices=prices, facility=facility)
    (phase,) = est.phases
    assert phase.steps == math.ceil(1e9 / (64 * 2048))
    assert est.work_s == pytest.approx(phase.steps * phase.evaluation.step_time_s, rel=1e-12)
    assert est.wall_s == est.work_s and est.goodput is None
    # datasheet power only: every activity at 700 W, so GPU energy = 8 GPUs x 700 W x time
    assert est.gpu_energy_j == pytest.approx(8 * 700.0 * est.work_s, rel=1e-9)
    nodes = 1
    it_j = est.gpu_energy_j + (1000.0 * nodes + 20.0 * 8) * est.wall_s
    assert est.energy_j == pytest.approx(1.5 * it_j, rel=1e-9)
    assert est.gpu_hours == pytest.approx(8 * est.wall_s / 3600)
    kwh = est.energy_j / 3.6e6
    assert est.cost_usd == pytest.approx(3.0 * est.gpu_hours + 0.1 * kwh, rel=1e-9)


def test_goodput_is_dalys_expectation_and_the_monte_carlo_agrees() -> None:
    failures = FailureModel(
        interruptions_per_gpu_hour=0.5, restart_s=30.0, checkpoint_write_bytes_per_s=1e9
    )
    est = _estimate(failures=failures)
    gp, mc = est.goodput, est.monte_carlo
    assert gp is not None and mc is not None
    mtbf_s = 3600 / (0.5 * 8)
    assert est.checkpoint_s == pytest.approx(MODEL_PARAMS_BYTES() / 1e9)
    oracle = expected_wall_s(
        work_s=est.work_s,
        interval_s=gp.interval_s,
        checkpoint_s=est.checkpoint_s,
        restart_s=30.0,
        mtbf_s=mtbf_s,
    )
    assert est.wall_s == pytest.approx(oracle, rel=1e-12)
    assert abs(mc.mean_wall_s - oracle) < 3 * mc.wall_s_ci95
    assert 0 < gp.goodput_fraction < 1 and est.gpu_hours > 8 * est.work_s / 3600
    # restarts, checkpoints and re-done work cost energy beyond the failure-free run
    free = _estimate()
    assert est.gpu_energy_j is not None and free.gpu_energy_j is not None
    assert est.gpu_energy_j > free.gpu_energy_j


def MODEL_PARAMS_BYTES() -> float:
    """14 bytes per parameter of megatron-1.7b (bf16 weights + fp32 master + Adam m, v)."""
    from plansim.analytic.moe_counts import count_moe_parameters

    return 14.0 * count_moe_parameters(MODEL).total_with_mtp


def test_each_phase_runs_its_own_batch_and_a_phase_the_layout_cannot_take_is_named() -> None:
    run = TrainingRun(
        tokens=2e9,
        phases=(RampPhase(global_batch_size=32, until_tokens=1e9), RampPhase(global_batch_size=64)),
    )
    est = _estimate(run=run)
    small, large = est.phases
    assert (small.global_batch_size, large.global_batch_size) == (32, 64)
    assert (
        small.evaluation.plan.num_microbatches == 4 and large.evaluation.plan.num_microbatches == 8
    )
    assert small.evaluation.step_time_s < large.evaluation.step_time_s
    bad = TrainingRun(
        tokens=2e9,
        phases=(RampPhase(global_batch_size=12, until_tokens=1e9), RampPhase(global_batch_size=64)),
    )
    rejected = estimate_run(MODEL, _plan(), PROFILE, bad)  # type: ignore[arg-type]
    assert isinstance(rejected, Rejected)
    assert rejected.reason.startswith("ramp phase 0 (global batch 12, seq 2048)")


def test_a_price_table_without_the_profile_is_an_error() -> None:
    with pytest.raises(SpecError, match="no price for 'h100-sxm5-80gb'; it prices: a100"):
        _estimate(prices=PriceTable(usd_per_gpu_hour={"a100": 1.0}))


# ------------------------------------------------------------------------- CLI
SIM = ["simulate", "--model", "megatron-1.7b", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
SIM += ["--gbs", "64", "--tp", "2", "--pp", "2", "--mbs", "4"]


def test_simulate_tokens_prints_the_run_and_json_has_its_columns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failures = str(EXAMPLES / "llama3-405b-failures.yaml")
    assert main([*SIM, "--tokens", "1e10", "--failures", failures]) == 0
    out = capsys.readouterr().out
    assert "the whole run (1e+10 tokens, 1 ramp phase(s))" in out
    assert "goodput" in out and "Monte Carlo" in out
    assert main([*SIM, "--tokens", "1e10", "--failures", failures, "--format", "json"]) == 0
    run = json.loads(capsys.readouterr().out)["run"]
    for key in ("days", "gpu_hours", "energy_mwh", "goodput_pct", "checkpoint_interval_min"):
        assert run[key] is not None, key
    assert run["cost_usd"] is None and run["energy_scope"].startswith("GPUs only")


def test_run_files_need_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIM, "--failures", str(EXAMPLES / "llama3-405b-failures.yaml")]) == 2
    assert "--failures needs --tokens" in capsys.readouterr().err
    assert main([*SIM, "--tokens", "-3"]) == 2
    assert "--tokens must be a positive" in capsys.readouterr().err


# ------------------------------------------------------------------------- plan and sweep
PLAN = ["plan", "--model", "megatron-1.7b", "--gpu", "h100-sxm5-80gb", "--gbs", "64", "--top", "3"]
PRICES = str(EXAMPLES / "prices.example.yaml")


def test_plan_tokens_adds_run_columns_and_orders_by_the_objective(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [*PLAN, "--gpus", "8", "--tokens", "1e10", "--prices", PRICES, "--format", "json"]
    assert main([*argv, "--objective", "cost"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["objective"] == "cost"
    costs = [p["run"]["cost_usd"] for p in doc["plans"]]
    assert costs == sorted(costs) and len(costs) == 3
    # GPU-hours x $2 (the example's H100 price), rounded to dollars
    for p in doc["plans"]:
        assert p["run"]["cost_usd"] == pytest.approx(2.0 * p["run"]["gpu_hours"], abs=2)
    assert main([*PLAN, "--gpus", "8", "--tokens", "1e10"]) == 0
    header = capsys.readouterr().out.splitlines()[2]
    assert "days" in header and "gpu_hours" in header and "cost_usd" not in header


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpus", "8", "--objective", "time-to-train"], "give --tokens"),
        (
            ["--gpus", "8", "--tokens", "1e10", "--objective", "cost"],
            "--objective cost needs --prices",
        ),
        (["--gpus", "8:16"], "--gpus A:B compares whole runs over GPU counts: give --tokens"),
        (["--gpus", "8:16", "--tokens", "1e10", "--save-plan", "x.yaml"], "--save-plan is for one"),
    ],
)
def test_plan_run_flags_refuse_what_they_cannot_answer(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*PLAN, *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_gpu_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:  # argparse's own usage error
        main([*PLAN, "--gpus", "16:8", "--tokens", "1e10"])
    assert exc.value.code == 2
    assert "a range A:B needs 1 <= A <= B" in capsys.readouterr().err


def test_plan_over_a_gpu_range_gives_one_run_per_count_and_its_pareto_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "runs.png"
    argv = [*PLAN, "--gpus", "8:16", "--tokens", "1e10", "--prices", PRICES, "--plot", str(plot)]
    assert main([*argv, "--format", "json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert [c["num_gpus"] for c in counts] == [8, 16]
    # twice the GPUs: close to half the days (data parallelism), never less than half
    assert 0.5 <= counts[1]["days"] / counts[0]["days"] < 0.6
    first = plot.read_bytes()
    assert first.startswith(b"\x89PNG")
    assert main(argv) == 0
    assert plot.read_bytes() == first  # same inputs, byte-identical plot


def test_sweep_tokens_writes_the_run_columns(tmp_path: Path) -> None:
    out = tmp_path / "sweep.csv"
    argv = ["sweep", "--model", "megatron-1.7b", "--gpu", "h100-sxm5-80gb", "--gpus", "8:16"]
    argv += ["--gbs", "64", "--tokens", "1e10", "--out", str(out), "--jobs", "1"]
    assert main(argv) == 0
    import pandas as pd

    table = pd.read_csv(out)
    assert table["num_gpus"].tolist() == [8, 16]
    assert table["days"].notna().all() and table["gpu_hours"].notna().all()
    assert table["cost_usd"].isna().all()  # no --prices: no cost


def test_plan_ramp_puts_each_phase_on_its_own_fastest_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ramp = _write(
        tmp_path,
        "phases:\n  - {until_tokens: 2.0e9, global_batch_size: 64, seq_length: 1024}\n"
        "  - {global_batch_size: 64}\n",
    )
    argv = [*PLAN, "--gpus", "8", "--tokens", "1e10", "--ramp", str(ramp), "--format", "json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    phases = doc["per_phase_plans"]["phases"]
    assert [(p["global_batch_size"], p["seq_length"]) for p in phases] == [(64, 1024), (64, 2048)]
    own = doc["per_phase_plans"]["run"]["days"]
    # each phase on its fastest plan is never slower than one layout for the whole ramp
    assert len(doc["plans"]) == 3 and all("run" in p for p in doc["plans"])
    assert own <= min(p["run"]["days"] for p in doc["plans"])


def test_published_runs_within_15_percent_and_the_readme_table_is_the_benchmarks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """benchmarks/bench_training_run.py (inputs in its docstring): Llama 3.1 405B's 30.84M
    H100 GPU-hours (its model card) and DeepSeek-V3's 2.664M H800 GPU-hours (arXiv
    2412.19437 Table 1) within 15%, goodput above Llama 3's "90% effective training time";
    the table in docs/guides/whole-run.md is what the benchmark prints, not typed."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    path = root / "benchmarks" / "bench_training_run.py"
    spec = importlib.util.spec_from_file_location("bench_training_run", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    table = bench.table()
    assert table["error_pct"].abs().max() <= 15.0, table
    assert (table["goodput_pct"] > 90).all()
    printed = table.to_string(index=False)
    page = root / "docs" / "guides" / "whole-run.md"
    assert "```text\n" + printed + "\n```" in page.read_text(encoding="utf-8")


def test_a_deadline_ranks_the_runs_that_make_it_first_and_names_the_fewest_gpus(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [*PLAN, "--gpus", "8:16", "--tokens", "1e10", "--format", "json"]
    assert main(argv) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    days_8, days_16 = (c["days"] for c in counts)
    between = (days_8 + days_16) / 2  # 16 GPUs make it, 8 do not
    assert main([*PLAN, "--gpus", "8:16", "--tokens", "1e10", "--deadline-days", str(between)]) == 0
    out = capsys.readouterr().out
    assert f"the fewest GPUs that finish within {between:g} days: 16" in out
    # one count: the slower plans miss a deadline just above the fastest plan's days
    assert main([*PLAN, "--gpus", "8", "--tokens", "1e10", "--format", "json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    fastest, slowest = plans[0]["run"]["days"], plans[-1]["run"]["days"]
    assert fastest < slowest
    tight = str((fastest + slowest) / 2)
    argv = [*PLAN, "--gpus", "8", "--tokens", "1e10", "--deadline-days", tight, "--format", "json"]
    assert main([*argv, "--objective", "energy"]) == 0
    meets = [p["run"]["meets_deadline"] for p in json.loads(capsys.readouterr().out)["plans"]]
    assert meets[0] is True and meets[-1] is False and meets == sorted(meets, reverse=True)
    assert main([*PLAN, "--gpus", "8", "--tokens", "1e10", "--deadline-days", "0"]) == 2
    assert "--deadline-days must be a positive number" in capsys.readouterr().err
    assert main([*PLAN, "--gpus", "8", "--deadline-days", "3"]) == 2
    assert "--deadline-days needs --tokens" in capsys.readouterr().err
