"""Facts of published runs read from the launch scripts their sources cite (pure data).

Some published runs give their configuration only through the script they were launched
with: the runs-CSV row cites it (or the paper whose artifact it is) in ``source_locator`` but
leaves the cells blank. The back-test (``plansim.planner.run_space``) fills such blank cells
from the script's own flags instead of searching them, and dates the run by the software it
names. Each entry cites the script and the flags it was read from; a stated cell always wins.

Two kinds of entry:

* a script named in the locator (``SCRIPTS``, matched by its path), one configuration;
* a paper whose artifact holds one script per table (``TABLE_SCRIPTS``, matched by the
  paper's arXiv id and the table named in the locator), one case per model: the row's shape
  and GPU count pick the case (a row whose stated tp or pp differs from the case's is not
  that case).

Searching a blank micro-batch size or virtual pipeline size predicts the fastest layout, not
the one that ran (the winner's curse: the search takes the minimum over layouts whose
predictions each carry error, so it lands below the run). Where the run's own script says
what it set, the back-test predicts that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from plansim.io.runs import RunRow


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptFacts:
    """What one launch script (or one case of it) states.

    Attributes:
        year: year of the software stack the script runs (container or release date).
        recompute: Megatron-LM recompute mode the flags select ("none", "selective", "full").
        virtual_pipeline_size: model chunks per pipeline rank; 1 when the script sets no
            virtual pipeline (interleaving) flag.
        micro_batch_size: ``--micro-batch-size`` (sequences); None when the script leaves it
            to a variable it does not set.
        overlap_grad_reduce: the data-parallel gradient all-reduce runs in buckets during the
            last micro-batch's backward (``--DDP-impl torch``: PyTorch DDP, which Megatron-LM
            2021 drives with ``no_sync`` for every other micro-batch); False for Megatron's
            ``local`` DDP of 2021, which all-reduces after the backward.
        source: the script, commit and flags the facts come from.
    """

    year: int
    recompute: str
    virtual_pipeline_size: int
    source: str
    micro_batch_size: int | None = None
    overlap_grad_reduce: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptCase:
    """One model's case in a per-table script: the shape and GPUs that select it.

    Attributes:
        num_layers, hidden_size: ``--num-layers`` / ``--hidden-size``.
        num_gpus: nodes x 8 GPUs (``NNODES``, ``--ntasks-per-node=8``).
        tp, pp: ``--tensor-model-parallel-size`` / ``--pipeline-model-parallel-size``.
        facts: what the case sets.
    """

    num_layers: int
    hidden_size: int
    num_gpus: int
    tp: int
    pp: int
    facts: ScriptFacts


#: Launch scripts by their path as cited in ``source_locator``.
SCRIPTS: dict[str, ScriptFacts] = {
    "examples/pretrain_gpt3_175B.sh": ScriptFacts(
        year=2020,
        recompute="full",
        virtual_pipeline_size=1,
        source=(
            "NVIDIA/Megatron-LM examples/pretrain_gpt3_175B.sh: --checkpoint-activations (full "
            "recompute), --fp16, no --num-layers-per-virtual-pipeline-stage, container "
            "nvcr.io/nvidia/pytorch:20.12-py3 (December 2020)"
        ),
    ),
}

_SC21_TABLE_1 = (
    "NVIDIA/Megatron-LM examples/sc21/run_table_1.sh @cf547dea (the SC21 paper's scripts, "
    "examples/sc21/README.md; CONFIG.sh: --fp16, --DDP-impl ${DDP}; SRUN.sh: container "
    "nvcr.io/nvidia/pytorch:20.12-py3)"
)


def _sc21_table_1(
    layers: int, hidden: int, nodes: int, tp: int, pp: int, mbs: int, ddp: str, per_chunk: int
) -> ScriptCase:
    """One MODEL_SIZE case of run_table_1.sh: NLS, HS, NNODES, TP, PP, MBS, DDP and
    ``--num-layers-per-virtual-pipeline-stage`` (0: not set); every case sets
    ``--activations-checkpoint-method uniform`` (full recompute of every layer)."""
    vpp = layers // (pp * per_chunk) if per_chunk else 1
    flags = f"--micro-batch-size {mbs}, --DDP-impl {ddp}"
    if per_chunk:
        flags += f", --num-layers-per-virtual-pipeline-stage {per_chunk} (vpp {vpp})"
    facts = ScriptFacts(
        year=2021,
        recompute="full",
        virtual_pipeline_size=vpp,
        micro_batch_size=mbs,
        overlap_grad_reduce=ddp == "torch",
        source=f"{_SC21_TABLE_1}, case {layers} layers x {hidden}: {flags}",
    )
    return ScriptCase(
        num_layers=layers, hidden_size=hidden, num_gpus=8 * nodes, tp=tp, pp=pp, facts=facts
    )


#: Per-table scripts by (arXiv id, table) as named in ``source_locator``: Narayanan et al.
#: SC21 (arXiv:2104.04473) Table 1, the weak-scaling runs from 1.7B to 1T parameters.
TABLE_SCRIPTS: dict[tuple[str, str], tuple[ScriptCase, ...]] = {
    ("2104.04473", "Table 1"): (
        _sc21_table_1(24, 2304, 4, 1, 1, 16, "torch", 0),
        _sc21_table_1(30, 3072, 8, 2, 1, 16, "torch", 0),
        _sc21_table_1(36, 4096, 16, 4, 1, 16, "torch", 0),
        _sc21_table_1(40, 6144, 32, 8, 1, 8, "torch", 0),
        _sc21_table_1(48, 8192, 64, 8, 2, 4, "local", 0),
        _sc21_table_1(60, 10240, 128, 8, 4, 2, "local", 5),
        _sc21_table_1(80, 12288, 192, 8, 8, 2, "local", 5),
        _sc21_table_1(96, 16384, 240, 8, 16, 1, "local", 3),
        _sc21_table_1(105, 20480, 315, 8, 35, 1, "local", 1),
        _sc21_table_1(128, 25600, 384, 8, 64, 1, "local", 0),
    ),
}


def _case_matches(case: ScriptCase, row: RunRow) -> bool:
    """The row is this case: same layers, hidden size and GPUs, and no stated tp or pp that
    differs from the case's."""
    if (row.integer("num_layers"), row.integer("hidden_size"), row.integer("num_gpus")) != (
        case.num_layers,
        case.hidden_size,
        case.num_gpus,
    ):
        return False
    return all(
        row.integer(column) in (None, value) for column, value in (("tp", case.tp), ("pp", case.pp))
    )


def script_facts(row: RunRow) -> ScriptFacts | None:
    """Facts of the launch script the row's ``source_locator`` names (the first known
    script path), else of its paper table's case for the row's shape and GPUs; None when
    neither is known.

    Raises:
        InputFileError: a shape cell read on the way is malformed (``RunRow.integer``).
    """
    locator = row.text("source_locator") or ""
    for path in sorted(SCRIPTS):
        if path in locator:
            return SCRIPTS[path]
    for (paper, table), cases in sorted(TABLE_SCRIPTS.items()):
        if paper in locator and re.search(rf"\b{re.escape(table)}\b", locator):
            for case in cases:
                if _case_matches(case, row):
                    return case.facts
    return None
