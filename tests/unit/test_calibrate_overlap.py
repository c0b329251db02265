"""``plansim calibrate`` measures ``overlap_compute_slowdown_fraction``: the plan's item, the
fraction from raw rows (worked by hand), the merge into a profile (key, provenance, YAML round
trip), a missing or failed measurement keeping the base's value, the offline rebuild, and
the bench's control flow (repetitions, the chain outlasting the loop) with a stand-in for
``torch.distributed`` (torch is imported there; nothing is launched).

Worked oracle: a GEMM call takes 10 ms alone and 12.5 ms while the all_reduce chain runs on
both ranks: 12.5 / 10 - 1 = 0.25 (25% longer).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from plansim.calibrate.build import build_update
from plansim.calibrate.build_terms import MAX_OVERLAP_FRACTION, Terms, overlap_term
from plansim.calibrate.plan import build_plan
from plansim.calibrate.raw import frame, raw_path, read_raw, write_raw
from plansim.calibrate.rebuild import rebuild
from plansim.calibrate.run_info import RunInfo
from plansim.errors import InputFileError
from plansim.io.profiles import (
    ProfileUpdate,
    load_profile,
    merge_profile,
    profile_from_dict,
    profile_to_yaml,
    write_profile,
)

KEY = "overlap_compute_slowdown_fraction"
SHAPE = "512x512x512x4194304"
FLOPS = 2.0 * 512**3
RUN = "20250101T000000.000Z"
#: the run id the shipped CPU profile cites (its raw CSV holds that run's rows)
CPU_RUN = "20261122T124837.456Z"


def _row(
    op: str, rank: int, time_s: float, *, sweep: int = 0, status: str = "ok"
) -> dict[str, Any]:
    return {
        "kind": "overlap",
        "op": op,
        "dtype": "fp32",
        "shape": SHAPE,
        "group_size": 2,
        "sweep": sweep,
        "work": FLOPS,
        "work_unit": "flop",
        "rank": rank,
        "status": status,
        "reps": 3 if status == "ok" else 0,
        "inner": 3 if status == "ok" else 0,
        "median_s": time_s,
        "min_s": time_s,
        "max_s": time_s,
        "cpu_share": math.nan,
        "note": "",
    }


def overlap_rows(
    alone_s: dict[int, float], beside_s: dict[int, float], *, sweep: int = 0
) -> list[dict[str, Any]]:
    """Rows of the ranks' ``gemm_alone`` and ``gemm_beside_all_reduce`` medians."""
    rows = [_row("gemm_alone", r, t, sweep=sweep) for r, t in alone_s.items()]
    return rows + [_row("gemm_beside_all_reduce", r, t, sweep=sweep) for r, t in beside_s.items()]


def _table(rows: list[dict[str, Any]], run_id: str = RUN) -> pd.DataFrame:
    return frame(rows, run_id=run_id)


def _info() -> RunInfo:
    return RunInfo(
        run_id=RUN,
        date="2025-01-01",
        backend="gloo",
        device="cpu",
        nproc=2,
        quick=True,
        raw_file="x.raw.csv",
        env={"torch": "2.13.0+cpu", "device_name": "Test CPU", "cpu_count": "2"},
    )


# --------------------------------------------------------------------------- plan
@pytest.mark.parametrize("quick", [True, False])
def test_the_plan_has_one_overlap_item_per_pass_over_all_ranks(quick: bool) -> None:
    passes = 3 if quick else 5  # sampled in every pass: a drifting machine
    cpu = [i for i in build_plan(nproc=2, device="cpu", quick=quick).items if i.kind == "overlap"]
    assert [i.sweep for i in cpu] == list(range(passes))
    for item in cpu:
        assert (item.op, item.dtype, item.group_size) == ("gemm_beside_all_reduce", "fp32", 2)
        assert item.shape == (512, 512, 512, 1 << 22) and item.shape_text == SHAPE
        assert item.work == FLOPS and item.work_unit == "flop"
        assert item.label.startswith(f"overlap gemm_beside_all_reduce fp32 {SHAPE} over 2 ranks")
    gpu = [i for i in build_plan(nproc=8, device="cuda", quick=quick).items if i.kind == "overlap"]
    assert [(i.dtype, i.shape, i.group_size) for i in gpu] == [
        ("bf16", (8192, 8192, 8192, 1 << 28), 8)
    ] * passes


def test_one_rank_has_no_overlap_item() -> None:
    assert not [
        i for i in build_plan(nproc=1, device="cpu", quick=True).items if i.kind == "overlap"
    ]


# --------------------------------------------------------------------------- build
def test_fraction_worked_by_hand() -> None:
    # alone 10 ms, beside 12.5 ms on both ranks: 12.5 / 10 - 1 = 0.25
    terms = overlap_term(
        _table(overlap_rows({0: 0.010, 1: 0.010}, {0: 0.0125, 1: 0.0125})), source="measured: t"
    )
    assert terms.overlap_compute_slowdown_fraction == pytest.approx(0.25)
    assert terms.summary == [("overlap slowdown", "compute +25% beside all_reduce")]
    text = terms.provenance[KEY]
    assert text.startswith("measured: t; fp32 GEMM 512x512x512 ")
    assert "4194304 bytes over 2 ranks" in text and "2 ranks and 1 passes" in text


def test_each_rank_is_paired_with_its_own_alone_time_then_median_over_ranks() -> None:
    # rank 0: 12 / 10 - 1 = 0.2; rank 1: 26 / 20 - 1 = 0.3; median of the two: 0.25
    # (the ratio of the medians would be 19 / 15 - 1 = 0.267)
    rows = overlap_rows({0: 0.010, 1: 0.020}, {0: 0.012, 1: 0.026})
    assert overlap_term(_table(rows), source="s").overlap_compute_slowdown_fraction == (
        pytest.approx(0.25)
    )
    # three ranks: 0.1, 0.5, 0.2 -> 0.2
    rows = overlap_rows({0: 0.01, 1: 0.01, 2: 0.01}, {0: 0.011, 1: 0.015, 2: 0.012})
    assert overlap_term(_table(rows), source="s").overlap_compute_slowdown_fraction == (
        pytest.approx(0.2)
    )


def test_median_over_passes_of_the_median_over_ranks() -> None:
    rows = overlap_rows({0: 0.01, 1: 0.01}, {0: 0.011, 1: 0.011}, sweep=0)  # 0.1
    rows += overlap_rows({0: 0.01, 1: 0.01}, {0: 0.013, 1: 0.013}, sweep=1)  # 0.3
    rows += overlap_rows({0: 0.01, 1: 0.01}, {0: 0.014, 1: 0.014}, sweep=2)  # 0.4
    terms = overlap_term(_table(rows), source="s")
    assert terms.overlap_compute_slowdown_fraction == pytest.approx(0.3)
    assert "2 ranks and 3 passes" in terms.provenance[KEY]


def test_fraction_is_clipped_to_zero_and_below_one() -> None:
    faster = overlap_term(
        _table(overlap_rows({0: 0.01, 1: 0.01}, {0: 0.009, 1: 0.0095})), source="s"
    )
    assert faster.overlap_compute_slowdown_fraction == 0.0
    assert "(measured -0.075, clipped)" in faster.provenance[KEY]
    slower = overlap_term(_table(overlap_rows({0: 0.01, 1: 0.01}, {0: 0.05, 1: 0.05})), source="s")
    assert slower.overlap_compute_slowdown_fraction == MAX_OVERLAP_FRACTION == 0.99


def test_missing_or_failed_rows_give_no_term() -> None:
    assert overlap_term(_table([_row("gemm_alone", 0, 0.01)]), source="s") == Terms()
    failed = [_row("gemm_alone", r, 0.01) for r in (0, 1)]
    failed.append(_row("gemm_beside_all_reduce", 0, math.nan, status="skipped"))
    terms = overlap_term(_table(failed), source="s")
    assert terms.overlap_compute_slowdown_fraction is None
    assert terms.provenance == {} and terms.summary == []


# --------------------------------------------------------------------------- merge
def test_build_update_carries_the_fraction_and_the_merge_writes_it(tmp_path: Path) -> None:
    rows = _table(overlap_rows({0: 0.010, 1: 0.010}, {0: 0.0125, 1: 0.0125}))
    built = build_update(rows, _info(), base=None, name="x")
    assert built.update.scalars == {KEY: pytest.approx(0.25)}
    assert KEY in built.update.replaced_keys()
    assert ("overlap slowdown", "compute +25% beside all_reduce") in built.summary
    base = load_profile("h100-sxm5-80gb")
    assert base.overlap_compute_slowdown_fraction == 0.189
    merged = merge_profile(base, built.update)
    assert merged.overlap_compute_slowdown_fraction == pytest.approx(0.25)
    assert merged.provenance[KEY].startswith("measured: Test CPU, 2025-01-01, torch 2.13.0+cpu")
    assert merged.peak_flops_per_s == base.peak_flops_per_s  # nothing else changed
    data = yaml.safe_load(profile_to_yaml(merged))
    assert data[KEY] == 0.25 and data["provenance"][KEY] == merged.provenance[KEY]
    path = tmp_path / "merged.yaml"
    write_profile(merged, path)
    again = load_profile(str(path))
    assert again.overlap_compute_slowdown_fraction == 0.25
    assert again.provenance[KEY] == merged.provenance[KEY]


def test_a_measured_zero_is_written_with_its_source() -> None:
    base = dataclasses.replace(
        load_profile("cpu-2core-gloo"), overlap_compute_slowdown_fraction=0.0
    )
    base = dataclasses.replace(
        base, provenance={k: v for k, v in base.provenance.items() if k != KEY}
    )
    update = ProfileUpdate(scalars={KEY: 0.0}, provenance={KEY: "measured: here"})
    merged = merge_profile(base, update)
    data = yaml.safe_load(profile_to_yaml(merged))
    assert data[KEY] == 0 and data["provenance"][KEY] == "measured: here"
    assert profile_from_dict(data, source="t").overlap_compute_slowdown_fraction == 0.0
    # without a measurement the CPU profile still has no key
    assert KEY not in yaml.safe_load(profile_to_yaml(base))


def test_the_update_needs_a_source_and_a_valid_value() -> None:
    base = load_profile("cpu-2core-gloo")
    with pytest.raises(InputFileError, match=f"no source for: {KEY}"):
        merge_profile(base, ProfileUpdate(scalars={KEY: 0.2}))
    with pytest.raises(InputFileError, match=f"{KEY} must be in"):
        merge_profile(base, ProfileUpdate(scalars={KEY: 1.0}, provenance={KEY: "m"}))


def test_a_missing_or_failed_measurement_keeps_the_base_value() -> None:
    base = load_profile("h100-sxm5-80gb")
    failed = [_row("gemm_alone", r, 0.01) for r in (0, 1)]
    failed.append(_row("gemm_beside_all_reduce", 0, math.nan, status="unsupported"))
    launch = {**_row("gemm_alone", 0, 3e-6), "kind": "launch", "op": "tiny_add", "shape": "1"}
    for rows in ([launch], failed):  # a run without the item (older plan), one that failed
        built = build_update(_table(rows), _info(), base=base, name=base.name)
        assert KEY not in built.update.scalars
        assert not any(label == "overlap slowdown" for label, _ in built.summary)
        merged = merge_profile(base, built.update)
        assert merged.overlap_compute_slowdown_fraction == 0.189
        assert merged.provenance[KEY] == base.provenance[KEY]
        assert yaml.safe_load(profile_to_yaml(merged))[KEY] == 0.189


# --------------------------------------------------------------------------- rebuild
def test_rebuild_from_the_raw_csv_takes_the_overlap_rows(tmp_path: Path) -> None:
    folder = Path(__file__).resolve().parents[2] / "hardware_profiles"
    for name in ("cpu-2core-gloo.yaml", "cpu-2core-gloo.raw.csv"):
        shutil.copy(folder / name, tmp_path / name)
    path = tmp_path / "cpu-2core-gloo.yaml"
    # the committed run's overlap rows, five passes of (alone, beside) seconds per GEMM call on
    # ranks 0 and 1; the median over passes of the median (two ranks: mean) of beside / alone - 1
    passes = [
        ((0.00327016466629, 0.00457430254179), (0.00344357591651, 0.00531471812519)),
        ((0.00213105340032, 0.0043017647331), (0.00225792606701, 0.0040568987999)),
        ((0.0023719654998, 0.00442191025), (0.00230910185746, 0.00402906760714)),
        ((0.0021887562, 0.00358014783342), (0.00222558973304, 0.00354346040015)),
        ((0.00228696522229, 0.00374365733296), (0.00216760966658, 0.00425961599992)),
    ]
    per_pass = sorted((b0 / a0 + b1 / a1) / 2 - 1 for (a0, b0), (a1, b1) in passes)
    assert rebuild(path).profile.overlap_compute_slowdown_fraction == pytest.approx(per_pass[2])
    raw = read_raw(raw_path(path))
    raw = raw[raw["kind"] != "overlap"]  # replaced by rows of a known 25% slowdown
    extra = _table(overlap_rows({0: 0.010, 1: 0.010}, {0: 0.0125, 1: 0.0125}), run_id=CPU_RUN)
    write_raw(pd.concat([raw, extra], ignore_index=True), raw_path(path))
    result = rebuild(path)
    assert result.profile.overlap_compute_slowdown_fraction == pytest.approx(0.25)
    cited = result.profile.provenance[KEY]
    assert cited.startswith("measured: ") and f"run {CPU_RUN}" in cited
    write_profile(result.profile, path)
    assert load_profile(str(path)).overlap_compute_slowdown_fraction == 0.25


# --------------------------------------------------------------------------- bench
class _Work:
    def __init__(self, fake: _Dist, *, done: bool) -> None:
        self.fake, self.done = fake, done

    def is_completed(self) -> bool:
        return self.done

    def wait(self) -> None:
        self.fake.in_flight -= 1


class _Dist:
    """torch.distributed stand-in: async all_reduces that end early while ``early`` says so."""

    def __init__(self, early: list[bool]) -> None:
        self.early, self.in_flight, self.done = early, 0, False
        self.chains: list[int] = []  # all_reduces per repetition's chain

    def barrier(self) -> None:
        assert self.in_flight == 0  # every repetition starts with nothing in flight

    def all_reduce(self, buffer: Any, async_op: bool = False) -> _Work | None:
        if not async_op:
            return None
        if self.in_flight == 0:
            self.chains.append(0)
            self.done = self.early.pop(0) if self.early else False
        self.chains[-1] += 1
        self.in_flight += 1
        return _Work(self, done=self.done)


def _bench(monkeypatch: pytest.MonkeyPatch, early: list[bool], dtype: str = "fp32") -> Any:
    """(rows, fake dist) of one rank timing a small overlap item: 10 ms per GEMM call alone,
    12.5 ms with all_reduces in flight."""
    bench_overlap = pytest.importorskip("plansim.calibrate.bench_overlap")
    from plansim.calibrate.plan import QUICK, Item

    fake = _Dist(early)
    monkeypatch.setattr(bench_overlap, "dist", fake)

    def timer(fn: Any, inner: int) -> float:
        fn()
        return 0.0125 if fake.in_flight else 0.010

    item = Item(
        kind="overlap",
        op="gemm_beside_all_reduce",
        dtype=dtype,
        shape=(64, 64, 64, 1024),
        group_size=2,
        work=2.0 * 64**3,
        work_unit="flop",
    )

    def row(it: Item, samples: list[float], inner: int, share: float) -> dict[str, Any]:
        return {"op": it.op, "samples": samples, "inner": inner, "note": ""}

    def note(it: Item, status: str, text: str) -> list[dict[str, Any]]:
        return [{"op": it.op, "status": status, "note": text}]

    import torch

    rows = bench_overlap.overlap_rows(
        item,
        device=torch.device("cpu"),
        timing=QUICK,
        timer=timer,
        agree_max=lambda value: value,
        row=row,
        note=note,
    )
    return rows, fake


def test_bench_times_alone_and_beside_a_chain_that_outlasts_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows, fake = _bench(monkeypatch, early=[])
    # 10 ms per call -> 3 calls per 30 ms loop; chain 2 x 30 ms / 10 ms per all_reduce = 6;
    # QUICK: at least 3 repetitions
    alone, beside = rows
    assert alone == {"op": "gemm_alone", "samples": [0.010] * 3, "inner": 3, "note": ""}
    assert beside["op"] == "gemm_beside_all_reduce" and beside["samples"] == [0.0125] * 3
    assert fake.chains == [6, 6, 6] and fake.in_flight == 0
    assert beside["note"].startswith("GEMM loop of 3 calls beside a chain of 6 async all_reduce")
    assert "0 repetitions discarded" in beside["note"]


def test_bench_discards_a_repetition_whose_chain_ended_early_and_doubles_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows, fake = _bench(monkeypatch, early=[True])
    alone, beside = rows
    assert len(alone["samples"]) == 4 and beside["samples"] == [0.0125] * 3
    assert fake.chains == [6, 12, 12, 12]
    assert "chain of 12 async" in beside["note"] and "1 repetitions discarded" in beside["note"]


def test_bench_notes_a_chain_that_always_ended_early(monkeypatch: pytest.MonkeyPatch) -> None:
    rows, fake = _bench(monkeypatch, early=[True] * 10)
    alone, skipped = rows
    assert alone["op"] == "gemm_alone" and len(alone["samples"]) == 4  # 1 + EXTRA_REPS
    assert fake.chains == [6, 12, 24, 48]
    assert skipped["status"] == "skipped" and "none kept" in skipped["note"]


def test_bench_reports_an_item_it_cannot_build(monkeypatch: pytest.MonkeyPatch) -> None:
    rows, fake = _bench(monkeypatch, early=[], dtype="fp8")
    assert [r["status"] for r in rows] == ["unsupported"] and fake.chains == []
    assert rows[0]["note"].startswith("unsupported: ")
