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
    """What one launch script (or one case of it) states; None where the script leaves the
    knob to a variable its cases sweep (the figure's axis), which the row then states or the
    back-test searches.

    Attributes:
        year: year of the software stack the script runs (container or release date).
        recompute: Megatron-LM recompute mode the flags select ("none", "selective", "full").
        virtual_pipeline_size: model chunks per pipeline rank; 1 when the script sets no
            virtual pipeline (interleaving) flag.
        micro_batch_size: ``--micro-batch-size`` (sequences).
        ddp_impl: ``--DDP-impl`` ("local" or "torch"; ``ParallelPlan.ddp_impl``), None where
            the script does not say (:attr:`overlap_grad_reduce` follows from it).
        source: the script, commit and flags the facts come from.
    """

    year: int
    recompute: str | None
    virtual_pipeline_size: int | None
    source: str
    micro_batch_size: int | None = None
    ddp_impl: str | None = None

    @property
    def overlap_grad_reduce(self) -> bool:
        """The data-parallel gradient all-reduce runs in buckets during the last
        micro-batch's backward: ``--DDP-impl torch`` (PyTorch DDP, which Megatron-LM 2021
        drives with ``no_sync`` for every other micro-batch); not Megatron's ``local`` DDP
        of 2021, which all-reduces after the backward."""
        return self.ddp_impl == "torch"


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptCase:
    """One case of a per-table (or per-figure) script: the shape and layout that select it.

    Attributes:
        num_layers, hidden_size: ``--num-layers`` / ``--hidden-size``.
        num_gpus: nodes x 8 GPUs (``NNODES``, ``--ntasks-per-node=8``).
        tp, pp: ``--tensor-model-parallel-size`` / ``--pipeline-model-parallel-size``; None
            where the script sweeps it (any stated value matches).
        facts: what the case sets.
    """

    num_layers: int
    hidden_size: int
    num_gpus: int
    tp: int | None
    pp: int | None
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

#: The SC21 paper's scripts (examples/sc21/README.md: "scripts that were used to produce the
#: results in the Megatron paper"); CONFIG.sh adds --fp16 --loss-scale 8192 and
#: --DDP-impl ${DDP}, SRUN.sh runs container nvcr.io/nvidia/pytorch:20.12-py3.
_SC21 = "NVIDIA/Megatron-LM examples/sc21/{script} @{commit}"
_FULL = "full"  # --checkpoint-activations / --activations-checkpoint-method uniform


def _sc21_case(
    where: tuple[str, str],
    shape: tuple[int, int, int],
    layout: tuple[int | None, int | None],
    *,
    mbs: int | None = 1,
    ddp: str = "local",
    per_chunk: int | None = 0,
    recompute: str | None = _FULL,
) -> ScriptCase:
    """One case of an SC21 script: ``where`` (script, commit), ``shape`` (NLS, HS, NNODES),
    ``layout`` (TP, PP; None: swept), MBS (None: swept), DDP,
    ``--num-layers-per-virtual-pipeline-stage`` (0: not set; None: swept) and the
    recompute flag (None: swept)."""
    layers, hidden, nodes = shape
    tp, pp = layout
    vpp: int | None = None  # swept: the row states it or the back-test searches it
    if per_chunk == 0:
        vpp = 1  # no interleaving flag
    elif per_chunk is not None and pp is not None:
        vpp = layers // (pp * per_chunk)
    flags = [f"--DDP-impl {ddp}"]
    flags += [f"--micro-batch-size {mbs}"] if mbs else []
    if per_chunk:
        flags += [f"--num-layers-per-virtual-pipeline-stage {per_chunk} (vpp {vpp})"]
    elif per_chunk == 0:
        flags += ["no --num-layers-per-virtual-pipeline-stage"]
    flags += ["full recompute of every layer"] if recompute == _FULL else []
    script, commit = where
    facts = ScriptFacts(
        year=2021,
        recompute=recompute,
        virtual_pipeline_size=vpp,
        micro_batch_size=mbs,
        ddp_impl=ddp,
        source=f"{_SC21.format(script=script, commit=commit)}, {layers} layers x {hidden}: "
        + ", ".join(flags),
    )
    return ScriptCase(
        num_layers=layers, hidden_size=hidden, num_gpus=8 * nodes, tp=tp, pp=pp, facts=facts
    )


_T1 = ("run_table_1.sh", "cf547dea")
_F11 = ("run_figure_11.sh", "4f4715db")
_F12 = ("run_figure_12.sh", "79a3bb6b")
_F13 = ("run_figure_13.sh", "79a3bb6b")
_F14 = ("run_figure_14.sh", "4f4715db")
_F15 = ("run_figure_15.sh", "4f4715db")
_F16 = ("run_figure_16.sh", "79a3bb6b")
_F17 = ("run_figure_17.sh", "79a3bb6b")
_F18 = ("run_figure_18.sh", "4076ab38")

#: Per-table and per-figure scripts by (arXiv id, table or figure) as named in
#: ``source_locator``: Narayanan et al. SC21 (arXiv:2104.04473) Table 1 (weak scaling, one
#: case per model size) and Figures 11-18 (each sweeps one knob; the others fixed).
TABLE_SCRIPTS: dict[tuple[str, str], tuple[ScriptCase, ...]] = {
    ("2104.04473", "Table 1"): (
        _sc21_case(_T1, (24, 2304, 4), (1, 1), mbs=16, ddp="torch"),
        _sc21_case(_T1, (30, 3072, 8), (2, 1), mbs=16, ddp="torch"),
        _sc21_case(_T1, (36, 4096, 16), (4, 1), mbs=16, ddp="torch"),
        _sc21_case(_T1, (40, 6144, 32), (8, 1), mbs=8, ddp="torch"),
        _sc21_case(_T1, (48, 8192, 64), (8, 2), mbs=4),
        _sc21_case(_T1, (60, 10240, 128), (8, 4), mbs=2, per_chunk=5),
        _sc21_case(_T1, (80, 12288, 192), (8, 8), mbs=2, per_chunk=5),
        _sc21_case(_T1, (96, 16384, 240), (8, 16), per_chunk=3),
        _sc21_case(_T1, (105, 20480, 315), (8, 35), per_chunk=1),
        _sc21_case(_T1, (128, 25600, 384), (8, 64)),
    ),
    # pipeline weak scaling: 3 layers and one node per pipeline rank
    ("2104.04473", "Figure 11"): tuple(
        _sc21_case(_F11, (3 * pp, 20480, pp), (8, pp)) for pp in (1, 2, 4, 8)
    ),
    # interleaved or not (swept), 175B
    ("2104.04473", "Figure 12"): (_sc21_case(_F12, (96, 12288, 12), (8, 12), per_chunk=None),),
    # tp x pp = 64 (swept), 162.2B
    ("2104.04473", "Figure 13"): (_sc21_case(_F13, (32, 20480, 8), (None, None)),),
    # pp x dp = 64, tp 1, 5.9B
    ("2104.04473", "Figure 14"): (_sc21_case(_F14, (32, 3840, 8), (1, None)),),
    # tp x dp = 64, pp 1, 5.9B
    ("2104.04473", "Figure 15"): (_sc21_case(_F15, (32, 3840, 8), (None, 1)),),
    # micro-batch size (swept), 91B
    ("2104.04473", "Figure 16"): (_sc21_case(_F16, (32, 15360, 8), (8, 8), mbs=None),),
    # activation recomputation (swept), 145B
    ("2104.04473", "Figure 17"): (_sc21_case(_F17, (80, 12288, 16), (8, 16), recompute=None),),
    # scatter/gather of pipeline sends (swept), 175B, interleaved
    ("2104.04473", "Figure 18"): (_sc21_case(_F18, (96, 12288, 12), (8, 12), per_chunk=2),),
}


def _case_matches(case: ScriptCase, row: RunRow) -> bool:
    """The row is this case: same layers, hidden size and GPUs, and no stated tp or pp that
    differs from one the case fixes."""
    if (row.integer("num_layers"), row.integer("hidden_size"), row.integer("num_gpus")) != (
        case.num_layers,
        case.hidden_size,
        case.num_gpus,
    ):
        return False
    return all(
        value is None or row.integer(column) in (None, value)
        for column, value in (("tp", case.tp), ("pp", case.pp))
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
