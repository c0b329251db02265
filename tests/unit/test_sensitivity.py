"""Sensitivity of a step time to the profile's terms (``plansim.specs.profile_terms``,
``plansim.planner.sensitivity``, ``plansim simulate --sensitivity``)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest

from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.commands.profiles import source_counts
from plansim.errors import SpecError
from plansim.io.profiles import list_profiles, load_profile
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.planner.robustness import RUN_TO_RUN_SPREAD_FRACTION, ranking_upsets, tied_with_best
from plansim.planner.sensitivity import SPEED_UP, sensitivity
from plansim.report.sensitivity_table import tie_text
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import OffloadDevice, ParallelPlan, Recompute, plan_from_fields
from plansim.specs.profile_terms import (
    PROFILE_TERMS,
    TERM_NAMES,
    faster,
    provenance_class,
    term_sources,
)
from tests.unit.synthetic import TINY_MODEL, round_profile

#: A model big enough that its DP all-reduce is bandwidth-bound on the round profile.
WIDE = dataclasses.replace(
    TINY_MODEL, hidden_size=1024, ffn_hidden_size=4096, seq_length=1024, num_attention_heads=8,
    num_query_groups=8,
)  # fmt: skip


def _evaluated(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile) -> Evaluation:
    outcome = evaluate(model, plan, profile)
    assert isinstance(outcome, Evaluation), outcome
    return outcome


def _all_faster(profile: HardwareProfile, factor: float) -> HardwareProfile:
    for term in TERM_NAMES:
        profile = faster(profile, term, factor)
    return profile


ONE_NODE_CASES = [
    pytest.param(
        "h100-sxm5-80gb-1gpu",
        dataclasses.replace(resolve_model("llama3-8b"), num_layers=4),
        plan_from_fields(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=2),
        id="measured-1gpu-host-elementwise-attention",
    ),
    pytest.param(
        "h100-sxm5-80gb",
        resolve_model("llama3-8b"),
        plan_from_fields(
            tp=2,
            pp=2,
            dp=2,
            micro_batch_size=1,
            global_batch_size=16,
            zero_stage=1,
            recompute=Recompute.FULL,
            overlap_grad_reduce=True,
        ),
        id="datasheet-tp-pp-dp",
    ),
    pytest.param(
        "cpu-2core-gloo",
        WIDE,
        plan_from_fields(tp=1, pp=2, dp=1, micro_batch_size=1, global_batch_size=4),
        id="serial-host-cpu",
    ),
    pytest.param(
        "h100-sxm5-80gb-1gpu",
        dataclasses.replace(resolve_model("llama3-8b"), num_layers=4),
        plan_from_fields(
            tp=1,
            pp=1,
            dp=1,
            micro_batch_size=1,
            global_batch_size=2,
            zero_stage=3,
            offload_optimizer=OffloadDevice.CPU,
        ),
        id="offload-pcie-cpu-adam",
    ),
]


@pytest.mark.parametrize(("profile_name", "model", "plan"), ONE_NODE_CASES)
def test_every_term_faster_divides_a_one_node_step(
    profile_name: str, model: ModelSpec, plan: ParallelPlan
) -> None:
    """Inside one node every second is priced from the profile, so the terms together are
    the whole of it: all of them 1.1x faster is a step 1.1x shorter. A rate or a latency
    left out of the terms, or a hardware figure written into code, breaks this."""
    profile = load_profile(profile_name)
    base = _evaluated(model, plan, profile)
    quicker = evaluate(model, plan, _all_faster(profile, 1.1), checked=True)
    assert isinstance(quicker, Evaluation)
    assert quicker.step_time_s * 1.1 == pytest.approx(base.step_time_s, rel=1e-9)


def test_one_gpu_step_rests_on_no_link() -> None:
    profile = load_profile("h100-sxm5-80gb-1gpu")
    model = dataclasses.replace(resolve_model("llama3-8b"), num_layers=4)
    plan = plan_from_fields(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=2)
    s = sensitivity(model, plan, profile, base=_evaluated(model, plan, profile))
    by = {t.term: t.elasticity for t in s.terms}
    assert by["scale_up"] == by["scale_out"] == by["pcie"] == 0.0
    assert by["compute"] > 0.5
    assert by["memory"] > 0.0 and by["launch"] > 0.0
    assert by["latency"] == 0.0  # no collective
    # Additive terms: the elasticities sum to about 1 (not exactly: a finite 10% step).
    assert s.total_elasticity == pytest.approx(1.0, abs=0.02)


def test_exposed_all_reduce_elasticity_matches_its_bandwidth_seconds() -> None:
    """dp2 inside a node, no overlap: the step's only link time is the exposed all-reduce,
    alpha + S / busbw. The NVLink term 10% faster removes (1 - 1/1.1) of its S / busbw part
    and nothing else, and the network term (no rank crosses a node) removes nothing."""
    profile = round_profile(gpus_per_node=2)
    plan = plan_from_fields(tp=1, pp=1, dp=2, micro_batch_size=1, global_batch_size=8)
    base = _evaluated(WIDE, plan, profile)
    exposed = base.exposed_comm_s_by_kind["dp_comm"]
    bandwidth_s = exposed - profile.intra_node["all_reduce"].latency_s
    assert bandwidth_s > 0.5 * exposed  # bandwidth-bound, so the check has teeth
    expected = base.step_time_s - bandwidth_s * (1 - 1 / SPEED_UP)
    s = sensitivity(WIDE, plan, profile, base=base)
    by = {t.term: t for t in s.terms}
    assert by["scale_up"].faster_step_time_s == pytest.approx(expected, rel=1e-12)
    assert by["scale_up"].elasticity == pytest.approx(
        math.log(base.step_time_s / expected) / math.log(SPEED_UP), rel=1e-9
    )
    assert by["scale_out"].elasticity == 0.0


def test_across_nodes_the_network_term_carries_the_all_reduce() -> None:
    profile = round_profile(gpus_per_node=1)
    plan = plan_from_fields(tp=1, pp=1, dp=2, micro_batch_size=1, global_batch_size=8)
    s = sensitivity(WIDE, plan, profile, base=_evaluated(WIDE, plan, profile))
    by = {t.term: t.elasticity for t in s.terms}
    assert by["scale_out"] > 0.3
    assert by["scale_up"] == 0.0


@pytest.mark.parametrize(
    ("source", "cls"),
    [
        ("measured: NVIDIA H100 80GB HBM3, 2026-11-27", "measured"),
        ("measured (third party): Lee et al. 2025", "measured"),
        ("nccl-tests: 8 x H100 NVSwitch", "measured"),
        ("derived from measurement: N09 rows", "derived"),
        ("datasheet: HW07 (H04) dense", "datasheet"),
        ("assumption: 5 us per kernel", "assumption"),
        ("from a blog post", "assumption"),
    ],
)
def test_provenance_class(source: str, cls: str) -> None:
    assert provenance_class(source) == cls


def test_term_sources_follow_the_plan_dtype() -> None:
    profile = load_profile("a100-sxm4-80gb")
    compute = next(t for t in PROFILE_TERMS if t.name == "compute")
    bf16 = term_sources(profile, compute, dtype="bf16")
    assert {"peak_tflops.bf16", "matmul_efficiency.bf16"} <= set(bf16)
    assert not any(k.endswith(".fp16") for k in bf16)
    launch = next(t for t in PROFILE_TERMS if t.name == "launch")
    assert term_sources(profile, launch, dtype="bf16") == {"kernel_launch_us": "assumption"}
    latency = next(t for t in PROFILE_TERMS if t.name == "latency")
    assert set(term_sources(profile, latency, dtype="bf16")) == {
        "nic_latency_us",
        *(f"intra_node.{c}.latency_us" for c in profile.intra_node),
    }
    # Every provenance key of a shipped profile that prices time belongs to some term
    # (capacity and power price memory and energy, not time).
    priced = set().union(*(term_sources(profile, t, dtype="bf16") for t in PROFILE_TERMS))
    capacity = {"hbm_capacity_gib", "memory_reserve_gib", "gpus_per_node", "max_power_w"}
    rest = {k for k in profile.provenance if not k.endswith((".fp16", ".tf32", ".fp32"))}
    assert rest - priced - capacity == {"overlap_compute_slowdown_fraction"}


def test_faster_rejects_an_unknown_term_and_a_bad_factor() -> None:
    profile = round_profile()
    with pytest.raises(SpecError, match="term='gpu' is not allowed; choose one of: compute"):
        faster(profile, "gpu", 1.1)
    with pytest.raises(SpecError, match="factor must be a positive number"):
        faster(profile, "compute", 0.0)


SIMULATE = [
    "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "8",
    "--gbs", "16", "--tp", "2", "--pp", "1", "--mbs", "1", "--zero", "1",
    "--recompute", "full", "--sensitivity",
]  # fmt: skip


def test_cli_table_names_every_term(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SIMULATE) == 0
    out = capsys.readouterr().out
    assert "what the step time rests on (h100-sxm5-80gb's terms):" in out
    for term in PROFILE_TERMS:
        assert term.label in out
    assert "terms resting on at least one assumed figure carry" in out


def test_cli_json_section_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIMULATE, "--format", "json"]) == 0
    first = capsys.readouterr().out
    assert main([*SIMULATE, "--format", "json"]) == 0
    assert capsys.readouterr().out == first
    section = json.loads(first)["sensitivity"]
    assert [t["term"] for t in section["terms"]] == list(TERM_NAMES)
    by = {t["term"]: t for t in section["terms"]}
    assert by["scale_up"]["elasticity"] > 0.0  # tp2 all-reduces over NVLink
    assert by["scale_out"]["elasticity"] == 0.0  # one node
    assert section["total_elasticity"] == pytest.approx(
        math.fsum(t["elasticity"] for t in section["terms"]), abs=1e-5
    )


def _ranked(profile: HardwareProfile, gbs: int) -> list[Evaluation]:
    """pp2, dp2 and tp2 of the wide model on two GPUs of one node, fastest first."""
    layouts = (
        {"tp": 1, "pp": 2, "dp": 1},
        {"tp": 1, "pp": 1, "dp": 2},
        {"tp": 2, "pp": 1, "dp": 1},
    )
    evs = [
        _evaluated(WIDE, plan_from_fields(micro_batch_size=1, global_batch_size=gbs, **kw), profile)
        for kw in layouts
    ]
    return sorted(evs, key=lambda ev: ev.step_time_s)


def test_a_close_ranking_flips_when_compute_is_slower() -> None:
    """At gbs 32, pp2 (70.14 ms) leads dp2 (70.33 ms) by its all-reduce against its bubble;
    with GEMMs 10% slower the bubble grows with the compute and dp2 comes first."""
    profile = round_profile(gpus_per_node=2)
    ranked = _ranked(profile, 32)
    assert [ev.plan.pp for ev in ranked[:2]] == [2, 1]
    upsets = ranking_upsets(WIDE, ranked, profile)
    assert [(u.term, u.factor, u.winner_rank) for u in upsets] == [("compute", 1 / SPEED_UP, 2)]
    slower = faster(profile, "compute", 1 / SPEED_UP)
    steps = [_evaluated(WIDE, ev.plan, slower).step_time_s for ev in ranked[:2]]
    assert upsets[0].winner_step_time_s == steps[1]
    assert upsets[0].margin_fraction == pytest.approx(1 - steps[1] / steps[0])
    assert upsets[0].margin_fraction > 0


def test_a_clear_ranking_has_no_upset() -> None:
    profile = round_profile(gpus_per_node=2)
    assert ranking_upsets(WIDE, _ranked(profile, 16), profile) == ()
    with pytest.raises(ValueError, match="at least one"):
        ranking_upsets(WIDE, [], profile)


def test_plans_within_the_run_to_run_spread_of_the_best_are_a_tie() -> None:
    """pp2 and dp2 at gbs 32 differ by 0.3% (70.14 / 70.33 ms): a tie; tp2 is further off.
    With the spread at 0 nothing ties; one plan alone ties with none."""
    profile = round_profile(gpus_per_node=2)
    ranked = _ranked(profile, 32)
    tied = tied_with_best(ranked)
    limit = ranked[0].step_time_s * (1 + RUN_TO_RUN_SPREAD_FRACTION)
    assert tied == tuple(ev.plan.label() for ev in ranked[1:] if ev.step_time_s <= limit)
    assert ranked[1].plan.label() in tied
    assert ranked[2].step_time_s > limit and ranked[2].plan.label() not in tied
    assert tied_with_best(ranked[:1]) == ()
    assert "A tie: 1 more plan(s) within 3.9%" in tie_text(tied)
    assert tie_text(()) == ""


PLAN = [
    "plan", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "8", "--gbs", "16",
    "--top", "3", "--jobs", "1", "--sensitivity",
]  # fmt: skip


def test_plan_cli_reports_the_best_plan_and_the_ranking(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(PLAN) == 0
    out = capsys.readouterr().out
    assert "what rank 1's step time rests on (h100-sxm5-80gb's terms):" in out
    assert "ranking under single-term profile errors" in out
    assert "the top 3 plans simulated again" in out
    assert main([*PLAN, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranking_robustness"]["num_plans"] == 3
    assert doc["tied_with_best"]["spread_fraction"] == RUN_TO_RUN_SPREAD_FRACTION
    assert isinstance(doc["tied_with_best"]["plans"], list)
    assert isinstance(doc["out_of_range_lookups_of_best"], list)
    assert len(doc["sensitivity_of_best"]["terms"]) == len(PROFILE_TERMS)


def test_plan_cli_refuses_sensitivity_in_csv(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--format", "csv"]) == 2
    err = capsys.readouterr().err
    assert "--sensitivity reports in the table or in JSON, not in CSV" in err
    assert "Traceback" not in err


def test_backtest_sensitivity_columns_and_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stated 22B row on one node: --out gains an elasticity per term that matches
    ``sensitivity`` of the chosen plan, and the summary line; without the flag, neither."""
    row = {
        "row_id": "S1", "model_name": "gpt-22b", "num_layers": "48", "hidden_size": "6144",
        "num_attention_heads": "64", "seq_len_tokens": "2048", "vocab_size": "51200",
        "gpu_type": "a100-sxm4-80gb", "num_gpus": "8", "tp": "8", "pp": "1",
        "micro_batch_size_seqs": "4", "global_batch_size_seqs": "4", "recompute": "full",
        "sequence_parallel": "no", "precision": "bf16", "step_time_s": "1.42",
        "framework": "Megatron-LM (2022)",
    }  # fmt: skip
    runs, out = tmp_path / "runs.csv", tmp_path / "pred.csv"
    with runs.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    assert main(["backtest", str(runs), "--jobs", "1", "--out", str(out), "--sensitivity"]) == 0
    text = capsys.readouterr().out
    assert "backtest sensitivity: the predicted step times rest on assumed profile figures" in text
    assert "; 0 of 1 read a profile curve outside its measured points" in text
    with out.open() as fh:
        written = next(csv.DictReader(fh))
    assert written["out_of_range_lookups"] == ""
    by = {name: float(written[f"elasticity_{name}"]) for name in TERM_NAMES}
    assert by["scale_out"] == 0.0 and by["scale_up"] > 0.0 and by["compute"] > 0.5
    assert float(written["elasticity_on_assumptions"]) == pytest.approx(
        math.fsum(v for k, v in by.items() if k in ("scale_out", "launch", "latency")), abs=1e-3
    )
    assert main(["backtest", str(runs), "--jobs", "1", "--out", str(out)]) == 0
    assert "backtest sensitivity" not in capsys.readouterr().out
    with out.open() as fh:
        assert "elasticity_compute" not in next(csv.DictReader(fh))


def test_profiles_list_counts_each_profile_s_sources(capsys: pytest.CaptureFixture[str]) -> None:
    profile = dataclasses.replace(
        round_profile(),
        provenance={
            "a": "measured: here",
            "b": "nccl-tests: there",
            "c": "assumption: a guess",
            "d": "datasheet: HW01",
        },
    )
    assert source_counts(profile) == "measured 2, datasheet 1, assumption 1"
    assert main(["profiles", "list"]) == 0
    out = capsys.readouterr().out
    assert "sources" in out.splitlines()[0]
    assert source_counts(load_profile("cpu-2core-gloo")) in out


def test_backtest_summary_counts_rows_read_outside_the_profile() -> None:
    from plansim.commands.backtest import _assumed_line

    line = _assumed_line([(12.0, 0.5, ("ring",)), (-2.0, 0.1, ()), (-11.0, 0.3, ())])
    assert "median elasticity of 0.30 (range 0.10-0.50)" in line
    assert "rows with |error| > 10%: median 0.40" in line
    assert "; 1 of 3 read a profile curve outside its measured points" in line


def test_every_shipped_provenance_entry_starts_with_its_kind() -> None:
    """hardware_profiles/README.md "Provenance rules": each entry starts with datasheet,
    nccl-tests, measured, derived or assumption, so the sensitivity's classes are read, not
    defaulted."""
    kinds = ("datasheet", "nccl-tests", "measured", "derived", "assumption")
    for name in list_profiles():
        for key, source in load_profile(name).provenance.items():
            assert source.strip().lower().startswith(kinds), f"{name}: {key}: {source[:60]!r}"
