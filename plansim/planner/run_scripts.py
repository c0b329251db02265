"""Facts of published runs read from the launch scripts their sources cite (pure data).

Some published runs give their configuration only through the script they were launched
with: the runs-CSV row cites it in ``source_locator`` but leaves the cells blank. The
back-test (``plansim.planner.run_space``) fills such blank cells from the script's own
flags instead of searching them, and dates the run by the software it names. Each entry
cites the script and the flags it was read from; a stated cell always wins.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptFacts:
    """What one launch script states.

    Attributes:
        year: year of the software stack the script runs (container or release date).
        recompute: Megatron-LM recompute mode the flags select ("none", "selective", "full").
        virtual_pipeline_size: 1 when the script sets no virtual pipeline (interleaving) flag.
        source: the flags and lines the facts come from.
    """

    year: int
    recompute: str
    virtual_pipeline_size: int
    source: str


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


def script_facts(source_locator: str) -> ScriptFacts | None:
    """Facts of the first known launch script named in ``source_locator``, or None."""
    for path in sorted(SCRIPTS):
        if path in source_locator:
            return SCRIPTS[path]
    return None
