"""CLI: plan, simulate, backtest, errors as one line (never a traceback)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from plansim.cli import main
from plansim.io.runs import RunRow
from plansim.planner.backtest import Prediction

SIM = [
    "simulate",
    "--model",
    "gpt3-175b",
    "--gpu",
    "a100-sxm4-80gb",
    "--gpus",
    "1024",
    "--tp",
    "8",
    "--pp",
    "16",
    "--mbs",
    "1",
    "--gbs",
    "1536",
]


def test_simulate_json_has_the_contract_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIM, "--recompute", "full", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in (
        "step_time_s",
        "tokens_per_s",
        "mfu",
        "hfu",
        "bubble_fraction",
        "peak_memory_bytes",
        "memory_breakdown_bytes",
    ):
        assert key in doc
    assert doc["plan"]["dp"] == 8 and doc["plan"]["num_microbatches"] == 192
    assert set(doc["memory_breakdown_bytes"]) >= {"activations", "optimizer", "weights"}


def test_simulate_is_byte_identical_across_runs(capsys: pytest.CaptureFixture[str]) -> None:
    main([*SIM, "--format", "json"])
    first = capsys.readouterr().out
    main([*SIM, "--format", "json"])
    assert capsys.readouterr().out == first


def test_simulate_rejects_plan_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "simulate",
        "--model",
        "gpt3-175b",
        "--gpu",
        "a100-sxm4-80gb",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--pp",
        "1",
        "--mbs",
        "1",
        "--gbs",
        "8",
    ]
    assert main(args) == 1
    assert "stage 0 needs" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dp", "4"], "tp(8) * pp(16) * dp(4) * cp(1) = 512 != --gpus(1024)"),
        (["--zero", "5"], "zero_stage=5"),
        (["--gbs", "1001"], "global_batch_size(1001) is not divisible by micro_batch_size(1)"),
        (["--vpp", "3"], "schedule 1f1b needs vpp == 1 (got vpp=3); use interleaved-1f1b"),
        (
            ["--schedule", "interleaved-1f1b", "--vpp", "4"],
            "gpt3-175b: num_layers(96) is not divisible by pp(16) * vpp(4) = 64: "
            "vpp must divide the 6 layers per pipeline rank (2, 3, 6)",
        ),
        (
            ["--schedule", "interleaved-1f1b", "--vpp", "3", "--gbs", "192"],
            "needs num_microbatches(24) = global_batch_size(192) / (micro_batch_size(1) * "
            "dp(8)) to be a multiple of pp(16)",
        ),
        (["--schedule", "interleaved-1f1b"], "schedule interleaved-1f1b needs vpp > 1"),
    ],
)
def test_simulate_bad_layout_is_one_clear_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SIM, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_simulate_interleaved(capsys: pytest.CaptureFixture[str]) -> None:
    # gbs 256: m = 32 micro-batches per replica, a multiple of pp = 16.
    base = [*SIM[:-1], "256", "--recompute", "full", "--format", "json"]
    assert main([*base, "--schedule", "interleaved-1f1b", "--vpp", "2"]) == 0
    interleaved = json.loads(capsys.readouterr().out)
    assert main(base) == 0
    flat = json.loads(capsys.readouterr().out)
    assert interleaved["plan"]["vpp"] == 2 and interleaved["plan"]["schedule"] == "interleaved-1f1b"
    assert interleaved["bubble_fraction"] < flat["bubble_fraction"]
    assert interleaved["step_time_s"] < flat["step_time_s"]


def test_simulate_v_and_dual_schedules_write_gantt_and_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [*SIM[:-1], "256", "--recompute", "full", "--format", "json"]
    results = {}
    for schedule in ("zb-v", "dualpipev", "dualpipe"):
        trace, plot = tmp_path / f"{schedule}.json", tmp_path / f"{schedule}.png"
        argv = [*base, "--schedule", schedule, "--trace", str(trace), "--plot", str(plot)]
        assert main(argv) == 0, capsys.readouterr().err
        results[schedule] = json.loads(capsys.readouterr().out)
        assert plot.stat().st_size > 10_000
        events = json.loads(trace.read_text())["traceEvents"]
        names = {e.get("name", "") for e in events}
        assert any(n.startswith("F") or "forward" in n for n in names)
    assert results["zb-v"]["plan"]["vpp"] == 2  # the V schedules' default
    assert results["dualpipe"]["plan"]["vpp"] == 1


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_calibrate_refuses_a_timeout_that_is_no_deadline(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["calibrate", "--backend", "gloo", "--nproc", "2", "--timeout", value]
    assert main([*argv, "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "--timeout must be a positive, finite number of seconds" in err
    assert not (tmp_path / "p.yaml").exists()


def test_unknown_model_and_profile_list_known_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SIM[1:3], "--gpu", "tpu-v9", *SIM[5:]]) == 2
    err = capsys.readouterr().err
    assert "unknown hardware profile 'tpu-v9'" in err and "a100-sxm4-80gb" in err
    assert main(["simulate", "--model", "gpt-9", *SIM[3:]]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'gpt-9'" in err and "llama3-70b" in err


def test_plan_table_and_rejections(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "plan",
        "--model",
        "megatron-1.7b",
        "--gpu",
        "a100-sxm4-80gb",
        "--gpus",
        "16",
        "--gbs",
        "64",
        "--top",
        "3",
        "--simulate-top",
        "6",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "step_time_s" in out and "candidates:" in out
    assert main([*args, "--format", "csv"]) == 0
    rows = list(csv.DictReader(capsys.readouterr().out.splitlines()))
    assert len(rows) == 3
    assert [float(r["step_time_s"]) for r in rows] == sorted(float(r["step_time_s"]) for r in rows)
    assert main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["plans"]) == 3 and "rejections" in doc


def _runs_csv(tmp_path: Path, rows: list[dict[str, str]]) -> Path:
    src = Path(__file__).resolve().parents[2].parent / "shared/reference/published_runs.csv"
    header = next(csv.reader(src.open()))
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in header})
    return path


BASE = {
    "row_id": "R1",
    "model_name": "tiny",
    "num_layers": "24",
    "hidden_size": "2304",
    "num_attention_heads": "24",
    "seq_len_tokens": "2048",
    "vocab_size": "51200",
    "gpu_type": "a100-sxm4-80gb",
    "num_gpus": "8",
    "tp": "1",
    "pp": "1",
    "dp": "8",
    "micro_batch_size_seqs": "4",
    "global_batch_size_seqs": "64",
    "recompute": "full",
    "zero_stage": "0",
    "sequence_parallel": "no",
    "precision": "bf16",
    "step_time_s": "2.0",
    "framework": "Megatron-LM (2022)",
}


def test_backtest_rows_summary_and_skips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _runs_csv(
        tmp_path,
        [
            BASE,
            {**BASE, "row_id": "R2", "gpu_type": "v100-sxm2-32gb"},
            {**BASE, "row_id": "R3", "precision": "fp4"},
            {**BASE, "row_id": "R4", "micro_batch_size_seqs": "", "recompute": ""},
        ],
    )
    out_csv = tmp_path / "pred.csv"
    assert main(["backtest", str(runs), "--out", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("backtest: 4 runs, 2 skipped, mean |error| ")
    rows = {r["row_id"]: r for r in csv.DictReader(out_csv.open())}
    assert len(rows) == 4
    assert rows["R1"]["status"] == "ok" and float(rows["R1"]["predicted_step_time_s"]) > 0
    assert rows["R2"]["status"] == "skipped" and "v100-sxm2-32gb" in rows["R2"]["note"]
    assert rows["R3"]["status"] == "skipped" and "fp4" in rows["R3"]["note"]
    assert "mbs searched" in rows["R4"]["note"] and "recompute searched" in rows["R4"]["note"]
    err = float(rows["R1"]["step_time_error_pct"])
    signed = [float(rows[r]["step_time_error_pct"]) for r in ("R1", "R4")]
    assert f"mean signed {sum(signed) / 2:+.1f}% (below 0: predicted too fast)" in out
    assert err == pytest.approx(
        100 * (float(rows["R1"]["predicted_step_time_s"]) - 2) / 2, abs=0.01
    )


def test_backtest_interleaved_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 24 layers on pp 4: 6 per rank; dp 2, mbs 4, gbs 64 -> m = 8, a multiple of pp (pp > 2:
    # Megatron-LM interleaved only pipelines of three or more ranks before 2024).
    pipe = {**BASE, "tp": "1", "pp": "4", "dp": "2"}
    runs = _runs_csv(
        tmp_path,
        [
            {**pipe, "row_id": "V3", "virtual_pipeline_size": "3"},
            {**pipe, "row_id": "V1", "virtual_pipeline_size": "1"},
            {**pipe, "row_id": "VB"},
        ],
    )
    out_csv = tmp_path / "pred.csv"
    assert main(["backtest", str(runs), "--out", str(out_csv)]) == 0
    capsys.readouterr()
    rows = {r["row_id"]: r for r in csv.DictReader(out_csv.open())}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    chosen = {k: r["note"].split("chosen: ")[1] for k, r in rows.items()}
    assert "vpp3" in chosen["V3"] and "interleaved-1f1b" in chosen["V3"]
    assert "vpp" not in chosen["V1"] and "interleaved" not in chosen["V1"]
    assert "vpp searched" in rows["VB"]["note"] and "vpp searched" not in rows["V3"]["note"]
    # the searched row may pick any vpp, so it is at least as fast as both fixed ones
    best = float(rows["VB"]["predicted_step_time_s"])
    assert best <= min(float(rows[k]["predicted_step_time_s"]) for k in ("V1", "V3"))
    # the predictions say where the step goes: fewer idle slots with three model chunks
    bubble = {k: float(r["predicted_bubble_fraction"]) for k, r in rows.items()}
    assert 0 < bubble["V3"] < bubble["V1"] < 1


def test_backtest_out_breaks_the_prediction_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out names the chosen plan, its MFU and exposed communication per kind; a skipped
    row leaves them blank."""
    runs = _runs_csv(
        tmp_path,
        [
            BASE,
            {**BASE, "row_id": "R4", "micro_batch_size_seqs": "2"},
            {**BASE, "row_id": "R2", "gpu_type": "v100-sxm2-32gb"},
        ],
    )
    out_csv = tmp_path / "pred.csv"
    assert main(["backtest", str(runs), "--out", str(out_csv)]) == 0
    capsys.readouterr()
    rows = {r["row_id"]: r for r in csv.DictReader(out_csv.open())}
    one, two = rows["R1"], rows["R4"]
    assert one["predicted_plan"] == one["note"].split("chosen: ")[1]
    assert "mbs4" in one["predicted_plan"] and "mbs2" in two["predicted_plan"]
    # same model, GPUs and batch: the same model FLOPs per step, so MFU x step time agrees
    work = [float(r["predicted_mfu_pct"]) * float(r["predicted_step_time_s"]) for r in (one, two)]
    assert work[0] == pytest.approx(work[1], rel=1e-3)
    assert 0 < float(one["predicted_mfu_pct"]) < 100
    exposed = dict(pair.split("=") for pair in one["predicted_exposed_comm_s"].split(";"))
    assert "dp_comm" in exposed and list(exposed) == sorted(exposed)
    # dp 8 reduces its gradients after the backward (no overlap flag): exposed, not all of it
    assert 0 < float(exposed["dp_comm"]) < float(one["predicted_step_time_s"])
    skipped = rows["R2"]
    assert skipped["status"] == "skipped"
    assert skipped["predicted_plan"] == skipped["predicted_mfu_pct"] == ""
    assert skipped["predicted_exposed_comm_s"] == ""


def test_backtest_malformed_cell_names_file_row_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed cell skips its row with the reason; the other rows are still predicted."""
    runs = _runs_csv(tmp_path, [{**BASE, "num_gpus": "eight"}, {**BASE, "row_id": "R2"}])
    assert main(["backtest", str(runs), "--out", str(tmp_path / "pred.csv")]) == 0
    out = capsys.readouterr().out
    assert "runs.csv: row R1 (line 2): column num_gpus: expected an integer, got 'eight'" in out
    assert "backtest: 2 runs, 1 skipped" in out
    written = pd.read_csv(tmp_path / "pred.csv")
    assert list(written["status"]) == ["skipped", "ok"]


def test_backtest_a_row_that_fails_is_reported_and_the_others_still_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception in one row (a plansim bug) marks that row failed, names the
    exception, keeps the other rows' predictions and makes the command exit 1."""
    from plansim.commands import backtest as command

    real = command.predict_row

    def flaky(row: RunRow, *, simulate_top: int = 8, sensitivity: bool = False) -> Prediction:
        if row.row_id == "R1":
            raise ZeroDivisionError("integer modulo by zero")
        return real(row, simulate_top=simulate_top, sensitivity=sensitivity)

    monkeypatch.setattr(command, "predict_row", flaky)
    runs = _runs_csv(tmp_path, [BASE, {**BASE, "row_id": "R2"}])
    pred = str(tmp_path / "pred.csv")
    assert main(["backtest", str(runs), "--out", pred, "--jobs", "1"]) == 1  # patched here
    out = capsys.readouterr().out
    assert "backtest: 2 runs, 0 skipped, 1 failed (a plansim bug: see the rows' notes)" in out
    rows = {r["row_id"]: r for r in csv.DictReader((tmp_path / "pred.csv").open())}
    assert rows["R1"]["status"] == "failed" and rows["R2"]["status"] == "ok"
    assert "ZeroDivisionError: integer modulo by zero, at test_cli.py:" in rows["R1"]["note"]
    assert rows["R1"]["predicted_step_time_s"] == ""


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--simulate-top", "0"], "--simulate-top must be a positive integer, got 0"),
        (["--out", "no/such/dir/pred.csv"], "--out: cannot write 'no/such/dir/pred.csv'"),
        (["--jobs", "0"], "--jobs must be a positive integer, got 0"),
    ],
)
def test_backtest_bad_options_fail_before_any_row_is_predicted(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flag: list[str],
    message: str,
) -> None:
    from plansim.commands import backtest as command

    def never(row: RunRow, *, simulate_top: int = 8) -> Prediction:
        raise AssertionError("a row was predicted")

    monkeypatch.setattr(command, "predict_row", never)
    monkeypatch.chdir(tmp_path)
    runs = _runs_csv(tmp_path, [BASE])
    assert main(["backtest", str(runs), "--jobs", "1", *flag]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_backtest_output_is_the_same_for_any_number_of_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows are predicted in worker processes with --jobs > 1 and reported in file order:
    the printed table, the summary and the --out file are byte-identical to --jobs 1."""
    runs = _runs_csv(
        tmp_path,
        [
            {**BASE, "micro_batch_size_seqs": ""},
            {**BASE, "row_id": "R2", "gpu_type": "v100-sxm2-32gb"},
            {**BASE, "row_id": "R3", "num_gpus": "16", "dp": "16", "step_time_s": "1.1"},
        ],
    )
    outputs = []
    for jobs in ("1", "2"):
        out_csv = tmp_path / f"pred{jobs}.csv"
        assert main(["backtest", str(runs), "--out", str(out_csv), "--jobs", jobs]) == 0
        outputs.append((capsys.readouterr().out, out_csv.read_bytes()))
    assert outputs[0] == outputs[1]
    assert [r["row_id"] for r in csv.DictReader((tmp_path / "pred2.csv").open())] == [
        "R1",
        "R2",
        "R3",
    ]


def test_simulate_megatron_implementation_flags(capsys: pytest.CaptureFixture[str]) -> None:
    base = [*SIM, "--recompute", "full", "--format", "json"]
    assert main(base) == 0
    fused = json.loads(capsys.readouterr().out)
    assert main([*base, "--no-gradient-accumulation-fusion"]) == 0
    unfused = json.loads(capsys.readouterr().out)
    assert unfused["plan"]["gradient_accumulation_fusion"] is False
    assert unfused["step_time_s"] > fused["step_time_s"]
    assert main([*base, "--overlap-grad-reduce"]) == 0
    overlapped = json.loads(capsys.readouterr().out)
    assert overlapped["plan"]["overlap_grad_reduce"] is True
    assert overlapped["step_time_s"] < fused["step_time_s"]


def test_backtest_progress_bar_counts_rows_on_stderr_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _runs_csv(tmp_path, [BASE, {**BASE, "row_id": "R2", "gpu_type": "v100-sxm2-32gb"}])
    assert main(["backtest", str(runs), "--jobs", "1"]) == 0
    plain = capsys.readouterr()
    assert main(["backtest", str(runs), "--jobs", "1", "--progress"]) == 0
    forced = capsys.readouterr()
    assert forced.out == plain.out and plain.err == ""
    assert "backtest:" in forced.err and "/2 " in forced.err  # drawn at once, cleared at the end


def test_huge_counts_are_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A 20-digit GPU count used to keep the planner enumerating divisors forever."""
    base = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gbs", "64"]
    with pytest.raises(SystemExit) as stopped:  # argparse's usage error: exit status 2
        main([*base, "--gpus", "100000000000000000000"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--gpus must be an integer from 1 to 10,000,000, got 100000000000000000000" in err
    with pytest.raises(SystemExit):
        main([*base, "--gpus", "8", "--seq-len", "0"])
    assert "--seq-len must be an integer from 1 to 100,000,000, got 0" in capsys.readouterr().err
