"""Blank back-test cells filled from the launch scripts a run's paper published
(``plansim.planner.run_scripts``): Narayanan et al. SC21 Table 1 ran from
NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh``, one case per model size, which sets the
micro-batch size, the layers per virtual pipeline stage and the DDP implementation that the
table leaves out."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from plansim.io.runs import RunRow
from plansim.planner.run_scripts import TABLE_SCRIPTS, script_facts
from plansim.planner.run_space import row_space
from plansim.specs.plan import Schedule

LOCATOR = "Narayanan et al. SC21 (arXiv:2104.04473) Table 1"
REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "published_runs.csv"

#: (layers, hidden, GPUs, tp, pp) -> (mbs, vpp, torch DDP), read off run_table_1.sh by hand:
#: vpp = layers / pp / --num-layers-per-virtual-pipeline-stage.
EXPECTED = {
    (24, 2304, 32, 1, 1): (16, 1, True),
    (30, 3072, 64, 2, 1): (16, 1, True),
    (36, 4096, 128, 4, 1): (16, 1, True),
    (40, 6144, 256, 8, 1): (8, 1, True),
    (48, 8192, 512, 8, 2): (4, 1, False),
    (60, 10240, 1024, 8, 4): (2, 3, False),
    (80, 12288, 1536, 8, 8): (2, 2, False),
    (96, 16384, 1920, 8, 16): (1, 2, False),
    (105, 20480, 2520, 8, 35): (1, 3, False),
    (128, 25600, 3072, 8, 64): (1, 1, False),
}


def _row(layers: int, hidden: int, gpus: int, **cells: str) -> RunRow:
    base = {
        "row_id": "Z1",
        "source_locator": LOCATOR,
        "framework": "Megatron-LM (2021)",
        "precision": "fp16",
        "num_layers": str(layers),
        "hidden_size": str(hidden),
        "num_gpus": str(gpus),
    }
    return RunRow(path="runs.csv", line=2, cells={**base, **cells})


@pytest.mark.parametrize(("case", "want"), sorted(EXPECTED.items()))
def test_every_table_1_case_as_the_script_sets_it(
    case: tuple[int, int, int, int, int], want: tuple[int, int, bool]
) -> None:
    layers, hidden, gpus, tp, pp = case
    facts = script_facts(_row(layers, hidden, gpus, tp=str(tp), pp=str(pp)))
    assert facts is not None
    assert (facts.micro_batch_size, facts.virtual_pipeline_size, facts.overlap_grad_reduce) == want
    assert facts.recompute == "full"
    assert "examples/sc21/run_table_1.sh" in facts.source
    assert len(TABLE_SCRIPTS[("2104.04473", "Table 1")]) == len(EXPECTED)


def test_the_reference_rows_of_table_1_each_find_their_case() -> None:
    if not REFERENCE.is_file():
        pytest.skip("../shared/reference is not beside this checkout")
    with REFERENCE.open(newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if "Table 1" in r["source_locator"]]
    assert len(rows) == 10
    for cells in rows:
        facts = script_facts(RunRow(path="runs.csv", line=2, cells=cells))
        assert facts is not None, cells["row_id"]
        assert facts.micro_batch_size is not None


@pytest.mark.parametrize(
    "cells",
    [
        {"num_gpus": "64"},  # another GPU count: not the script's case
        {"tp": "4"},  # a stated tp the case does not have
        {"pp": "2"},
        {"source_locator": "Narayanan et al. SC21 (arXiv:2104.04473) Table 2"},
        {"source_locator": "Narayanan et al. SC21 (arXiv:2104.04473) Table 10"},
        {"source_locator": "Some other paper, Table 1"},
    ],
)
def test_no_case_unless_paper_table_shape_and_gpus_all_match(cells: dict[str, str]) -> None:
    assert script_facts(_row(40, 6144, 256, **cells)) is None


def test_the_search_space_takes_the_script_s_cells_and_a_stated_cell_wins() -> None:
    notes: list[str] = []
    space = row_space(_row(60, 10240, 1024, tp="8", pp="4"), notes)
    assert space.micro_batch_size == (2,)
    assert space.vpps == (3,)
    assert space.schedules == (Schedule.INTERLEAVED_1F1B,)
    assert space.overlap_grad_reduce == (False,)  # Megatron's 2021 local DDP
    assert "mbs 2 from the launch script" in notes
    assert "vpp 3 from the launch script" in notes

    notes = []
    stated = row_space(
        _row(60, 10240, 1024, micro_batch_size_seqs="4", virtual_pipeline_size="1"), notes
    )
    assert stated.micro_batch_size == (4,)
    assert stated.vpps == (1,)
    assert not any("from the launch script" in n for n in notes)


def test_torch_ddp_cases_overlap_the_gradient_all_reduce() -> None:
    notes: list[str] = []
    space = row_space(_row(40, 6144, 256), notes)
    assert space.overlap_grad_reduce == (True,)
    assert any("PyTorch DDP" in n for n in notes)
    # the same model on a count the script does not run: 2021 Megatron, no overlap offered
    assert row_space(_row(40, 6144, 512), []).overlap_grad_reduce == (False,)


def _figure(figure: int, layers: int, hidden: int, gpus: int, **cells: str) -> RunRow:
    locator = f"Narayanan et al. SC21 (arXiv:2104.04473) Figure {figure}"
    return _row(layers, hidden, gpus, source_locator=locator, **cells)


def test_the_figure_scripts_fix_what_their_sweep_does_not() -> None:
    # Figure 13 sweeps tp x pp = 64 on the 162.2B model: any stated split is its case,
    # with mbs 1, full recompute and no interleaving
    facts = script_facts(_figure(13, 32, 20480, 64, tp="4", pp="16"))
    assert facts is not None
    assert (facts.micro_batch_size, facts.virtual_pipeline_size, facts.recompute) == (1, 1, "full")
    notes: list[str] = []
    space = row_space(_figure(13, 32, 20480, 64, tp="4", pp="16"), notes)
    assert space.vpps == (1,)
    assert Schedule.INTERLEAVED_1F1B not in space.schedules
    # Figure 11: 3 layers and one node per pipeline rank
    eleven = script_facts(_figure(11, 12, 20480, 32, pp="4"))
    assert eleven is not None and "run_figure_11.sh" in eleven.source
    assert script_facts(_figure(11, 12, 20480, 32, pp="2")) is None


def test_a_swept_knob_is_left_to_the_row_or_the_search() -> None:
    notes: list[str] = []
    # Figure 12 compares interleaved and not: vpp is searched unless the row says
    space = row_space(_figure(12, 96, 12288, 96), notes)
    assert space.vpps is None
    assert "vpp searched" in notes
    # Figure 18 ran interleaved with 2 layers per virtual stage in both of its cases
    assert row_space(_figure(18, 96, 12288, 96), []).vpps == (4,)
    # Figure 17 sweeps recompute: a blank cell stays searched
    fig17 = script_facts(_figure(17, 80, 12288, 128))
    assert fig17 is not None and fig17.recompute is None
    notes = []
    row_space(_figure(17, 80, 12288, 128), notes)
    assert "recompute searched" in notes
    # Figure 16 sweeps the micro-batch size
    assert row_space(_figure(16, 32, 15360, 64), []).micro_batch_size is None
