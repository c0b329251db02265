"""Peak memory as allocated, reserved and nvidia-smi read it (plansim.analytic.memory_views),
and the back-test comparing the reading a row names."""

from __future__ import annotations

from pathlib import Path

import pytest

from plansim.analytic.memory_views import (
    CUDA_CONTEXT_EAGER_BYTES,
    CUDA_CONTEXT_LAZY_BYTES,
    FRAGMENTATION_DYNAMIC,
    FRAGMENTATION_STATIC,
    GIB,
    NCCL_GROUP_BYTES,
    NCCL_PAIR_BYTES,
    communicator_sizes,
    memory_views,
)
from plansim.cli import main
from plansim.specs.plan import Framework, Recompute, plan_from_fields
from tests.unit.synthetic import SMALL_GPT, TINY_MODEL

EXTRA = Path(__file__).resolve().parents[2] / "benchmarks" / "published_runs"


def _plan(**fields: object):  # type: ignore[no-untyped-def]
    base = {"dp": 4, "tp": 8, "pp": 12, "micro_batch_size": 1, "global_batch_size": 48}
    return plan_from_fields(**(base | fields))


def test_a_deepspeed_pipeline_rank_holds_one_pair_group_per_neighbour() -> None:
    plan = _plan(framework=Framework.MEGATRON_DEEPSPEED)
    # world 384, tp 8, dp 4, then the two-rank groups to the neighbouring stages
    assert communicator_sizes(TINY_MODEL, plan, rank=0) == (384, 8, 4, 2)
    assert communicator_sizes(TINY_MODEL, plan, rank=5) == (384, 8, 4, 2, 2)
    assert communicator_sizes(TINY_MODEL, plan, rank=11) == (384, 8, 4, 2)


def test_a_megatron_pipeline_has_one_group_and_the_tied_embeddings_pair() -> None:
    plan = _plan()
    assert SMALL_GPT.tied_embeddings and not TINY_MODEL.tied_embeddings
    assert communicator_sizes(SMALL_GPT, plan, rank=0) == (384, 8, 4, 12, 2)
    assert communicator_sizes(SMALL_GPT, plan, rank=5) == (384, 8, 4, 12)
    assert communicator_sizes(TINY_MODEL, plan, rank=0) == (384, 8, 4, 12)
    one_gpu = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1)
    assert communicator_sizes(TINY_MODEL, one_gpu, rank=0) == (1,)
    assert memory_views(TINY_MODEL, one_gpu, allocated_bytes=GIB).nccl_bytes == 0


def test_the_three_readings_add_up_by_hand() -> None:
    plan = _plan(framework=Framework.MEGATRON_DEEPSPEED, recompute=Recompute.FULL)
    views = memory_views(TINY_MODEL, plan, allocated_bytes=10 * GIB, rank=0, year=2022)
    assert views.allocated_bytes == 10 * GIB
    assert views.reserved_bytes == pytest.approx(10 * GIB / 0.85)
    nccl = 3 * 688e6 + 544e6  # world, tp, dp groups + one neighbour pair
    assert views.nccl_bytes == pytest.approx(nccl)
    assert views.nvidia_smi_bytes == pytest.approx(10 * GIB / 0.85 + 1.78 * GIB + nccl)
    assert views.reading("nvidia-smi") == views.nvidia_smi_bytes
    assert views.reading("reserved") == views.reserved_bytes
    assert views.reading("allocated") == 10 * GIB
    assert (NCCL_GROUP_BYTES, NCCL_PAIR_BYTES) == (688e6, 544e6)


def test_fragmentation_follows_what_the_step_does_and_the_context_its_year() -> None:
    static = _plan()
    assert memory_views(TINY_MODEL, static, allocated_bytes=GIB).fragmentation_fraction == (
        FRAGMENTATION_STATIC
    )
    assert pytest.approx(0.0237, abs=1e-4) == FRAGMENTATION_STATIC
    for dynamic in (_plan(recompute=Recompute.FULL), _plan(pp=1, dp=48, zero_stage=3)):
        views = memory_views(TINY_MODEL, dynamic, allocated_bytes=GIB)
        assert views.fragmentation_fraction == FRAGMENTATION_DYNAMIC
    assert memory_views(TINY_MODEL, static, allocated_bytes=GIB, year=2021).cuda_context_bytes == (
        CUDA_CONTEXT_EAGER_BYTES
    )
    for year in (2023, None):
        views = memory_views(TINY_MODEL, static, allocated_bytes=GIB, year=year)
        assert views.cuda_context_bytes == CUDA_CONTEXT_LAZY_BYTES


def test_a_bad_reading_or_allocation_is_refused_with_the_allowed_values() -> None:
    views = memory_views(TINY_MODEL, _plan(), allocated_bytes=GIB)
    with pytest.raises(ValueError, match="allocated, reserved, nvidia-smi"):
        views.reading("smi")
    with pytest.raises(ValueError, match="allocated_bytes"):
        memory_views(TINY_MODEL, _plan(), allocated_bytes=-1.0)


def _bloom_rows(tmp_path: Path, kind: str) -> Path:
    lines = (EXTRA / "bloom_layout_search.csv").read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    column = header.index("measured_peak_mem_kind")
    row = lines[1]  # B0001: nvidia-smi 31.14 GB
    assert ",nvidia-smi," in row
    runs = tmp_path / f"runs-{kind or 'blank'}.csv"
    runs.write_text(f"{lines[0]}\n{row.replace(',nvidia-smi,', f',{kind},', 1)}\n", "utf-8")
    assert column > 0
    return runs


def _memory_error(out: str) -> float:
    summary = next(line for line in out.splitlines() if line.startswith("backtest peak memory"))
    return float(summary.split("mean signed ")[1].split("%")[0])


def test_the_backtest_compares_the_reading_the_row_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    errors = {}
    for kind in ("", "allocated", "reserved", "nvidia-smi"):
        assert main(["backtest", str(_bloom_rows(tmp_path, kind))]) == 0
        errors[kind] = _memory_error(capsys.readouterr().out)
    # each reading adds to the one before; blank keeps the simulated peak with the flat reserve
    assert errors["allocated"] < errors["reserved"] < errors["nvidia-smi"]
    assert errors["allocated"] < errors[""] < errors["nvidia-smi"]


def test_a_bad_memory_reading_skips_the_row_with_the_allowed_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backtest", str(_bloom_rows(tmp_path, "smi"))]) == 1
    out = capsys.readouterr().out
    assert "measured_peak_mem_kind 'smi' is not one of allocated, reserved, nvidia-smi" in out


def test_simulate_reports_the_three_readings_of_the_worst_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    args = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
    args += ["--gbs", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--mbs", "1"]
    assert main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    views = doc["memory_views_bytes"]
    assert views["allocated"] < views["reserved"] < views["nvidia_smi"]
    assert views["nvidia_smi"] == pytest.approx(
        views["reserved"] + views["cuda_context"] + views["nccl_buffers"]
    )
    reserve = 6.7 * GIB  # the profile's flat reserve, which the fit adds instead
    assert views["allocated"] == pytest.approx(doc["peak_memory_bytes"] - reserve, rel=1e-6)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "as users read it: allocated " in text and "nvidia-smi " in text
