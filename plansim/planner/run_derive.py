"""Cells a published run leaves blank but states through others (pure).

A blank cell is unknown (``../shared/reference/README.md``); some are still settled by
arithmetic on cells the row does state, and then the row is predicted rather than skipped:

* ``num_gpus`` = tp x pp x dp x cp, when tp, pp and dp are stated and cp is stated or is 1
  because the sequence is shorter than ``run_space.LONG_CONTEXT_TOKENS`` (the back-test
  searches cp > 1 only for long-context rows);
* ``global_batch_size_seqs`` = micro-batch size x gradient-accumulation steps x dp, when the
  three are stated or dp follows from num_gpus / (tp x pp x cp).

Each derived value is written into the row's cells (so every later reader sees it) and said
in the notes. A blank ``precision`` is searched among the 16-bit formats
(:func:`precision_candidates`): fp8 and fp4 training are always stated by those who publish
them, and 32-bit training of large transformers is not done.
"""

from __future__ import annotations

from dataclasses import replace

from plansim.io.runs import RunRow
from plansim.planner.run_space import LONG_CONTEXT_TOKENS

#: Precisions a blank ``precision`` cell is searched over (16-bit mixed precision).
BLANK_PRECISIONS = ("bf16", "fp16")


def _cp(row: RunRow) -> int | None:
    """The stated cp, or 1 for a blank cp on a sequence shorter than LONG_CONTEXT_TOKENS."""
    cp = row.integer("cp")
    if cp is not None:
        return cp
    seq = row.integer("seq_len_tokens")
    return 1 if seq is not None and seq < LONG_CONTEXT_TOKENS else None


def with_derived_cells(row: RunRow, notes: list[str]) -> RunRow:
    """The row with a blank ``num_gpus`` and ``global_batch_size_seqs`` filled in where the
    other cells settle them (module docstring), each noted; unchanged otherwise.

    Raises:
        InputFileError: a cell read on the way is malformed (``RunRow.integer``).
    """
    cells = dict(row.cells)
    tp, pp, dp, cp = row.integer("tp"), row.integer("pp"), row.integer("dp"), _cp(row)
    gpus = row.integer("num_gpus")
    if gpus is None and tp is not None and pp is not None and dp is not None and cp is not None:
        gpus = tp * pp * dp * cp
        cells["num_gpus"] = str(gpus)
        notes.append(f"num_gpus blank: {gpus} = tp {tp} x pp {pp} x dp {dp} x cp {cp}")
    if dp is None and gpus is not None and tp is not None and pp is not None and cp is not None:
        dp = gpus // (tp * pp * cp) if gpus % (tp * pp * cp) == 0 else None
    mbs, gas = row.integer("micro_batch_size_seqs"), row.integer("grad_accum_steps")
    stated_gbs = row.integer("global_batch_size_seqs")
    if stated_gbs is None and mbs is not None and gas is not None and dp is not None:
        gbs = mbs * gas * dp
        cells["global_batch_size_seqs"] = str(gbs)
        notes.append(
            f"global_batch_size_seqs blank: {gbs} = mbs {mbs} x grad_accum_steps {gas} x dp {dp}"
        )
    return row if cells == row.cells else replace(row, cells=cells)


def precision_candidates(row: RunRow) -> tuple[tuple[RunRow, str], ...]:
    """(row, note) per precision to predict: the row itself (no note) when it states one;
    with a blank cell, one copy per BLANK_PRECISIONS value with a note saying so (the
    back-test predicts each and keeps the fastest)."""
    if row.text("precision") is not None:
        return ((row, ""),)
    searched = ", ".join(BLANK_PRECISIONS)
    return tuple(
        (
            replace(row, cells={**row.cells, "precision": p}),
            f"precision blank: {p} (searched {searched})",
        )
        for p in BLANK_PRECISIONS
    )
