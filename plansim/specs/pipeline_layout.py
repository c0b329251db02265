"""Megatron-Core's pipeline layout strings: which layers each pipeline stage holds (pure).

Megatron-Core's ``--pipeline-model-parallel-layout`` (``PipelineParallelLayerLayout``,
``megatron/core/transformer/pipeline_parallel_layer_layout.py``) names every pipeline stage
(model chunk) in order, ``|`` between stages: ``E`` the input embedding, ``t`` a transformer
layer, ``m`` an MTP module, ``L`` the output layer and loss; ``x*N`` repeats a symbol and
``(...)*N`` a group. DeepSeek-V3 on pp 8 x vpp 4 runs ``Et|(tt|)*30L``: 32 stages, the first
with the embedding and one layer, 30 with two layers, the last with the loss alone
(``reference/moe_runs.csv`` M0222, Megatron-LM's DeepSeek-V3 GB200 guide).

plansim places the embedding on the first stage and the loss (and MTP modules) on the last,
so a layout must put ``E`` only in the first stage and ``L`` / ``m`` only in the last.
"""

from __future__ import annotations

import functools
import re

from plansim.errors import SpecError

#: Symbols of a stage: embedding, transformer layer, MTP module, loss.
SYMBOLS = "EtmL"
_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_SYMBOL_REPEAT = re.compile(r"([EtmL])\*(\d+)")


@functools.lru_cache(maxsize=256)  # pure: a search checks the same few strings per plan
def expand_layout(text: str) -> tuple[str, ...]:
    """The stages of a layout string, each a string of symbols (repetitions expanded).

    Raises:
        SpecError: a character outside ``EtmL|()*`` and digits, unbalanced parentheses, a
            repeat count below 1, or an empty layout.
    """
    field = "plan.pipeline_model_parallel_layout"
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"{field} must be a non-empty layout string like 'Et|(tt|)*30L'")
    flat = text.replace(" ", "")
    bad = sorted(set(re.sub(r"[EtmL|()*0-9]", "", flat)))
    if bad:
        raise SpecError(
            f"{field}({text!r}): unknown symbol(s) {', '.join(map(repr, bad))}; allowed: "
            f"E (embedding), t (layer), m (MTP), L (loss), '|' between stages, x*N, (...)*N"
        )
    for _ in range(len(flat)):  # innermost groups first
        expanded = _GROUP.sub(lambda g: g.group(1) * _count(field, text, g.group(2)), flat)
        if expanded == flat:
            break
        flat = expanded
    flat = _SYMBOL_REPEAT.sub(lambda g: g.group(1) * _count(field, text, g.group(2)), flat)
    if re.search(r"[()*0-9]", flat):
        raise SpecError(f"{field}({text!r}): unbalanced parentheses or a stray repeat count")
    return tuple(flat.split("|"))


def _count(field: str, text: str, digits: str) -> int:
    count = int(digits)
    if count < 1:
        raise SpecError(f"{field}({text!r}): repeat count {count} must be at least 1")
    return count


@functools.lru_cache(maxsize=256)
def layout_stage_layers(text: str, *, num_stages: int) -> tuple[int, ...]:
    """Transformer layers of each of ``num_stages`` stages under the layout ``text``.

    Raises:
        SpecError: the layout does not expand (:func:`expand_layout`), has another number of
            stages than ``num_stages`` (pp x vpp), or puts the embedding anywhere but the
            first stage or the loss or an MTP module anywhere but the last.
    """
    stages = expand_layout(text)
    field = f"plan.pipeline_model_parallel_layout({text!r})"
    if len(stages) != num_stages:
        raise SpecError(f"{field} has {len(stages)} stages; pp x vpp = {num_stages}")
    for index, stage in enumerate(stages):
        if "E" in stage and index != 0:
            raise SpecError(f"{field}: the embedding (E) sits in stage {index}, not the first")
        for symbol in "Lm":
            if symbol in stage and index != num_stages - 1:
                raise SpecError(
                    f"{field}: {symbol!r} sits in stage {index}; plansim puts the loss and the "
                    f"MTP modules on the last stage"
                )
    return tuple(stage.count("t") for stage in stages)


def balanced_layout(num_layers: int, *, num_stages: int) -> str:
    """A layout string for ``num_layers`` layers over ``num_stages`` stages that counts the
    embedding and the loss as one layer's slot each (as Megatron-LM's
    ``--account-for-embedding/loss-in-pipeline-split`` do) and spreads the L + 2 slots as
    evenly as the stages allow, the stages with one slot fewer taken from the ends (the
    last first): DeepSeek-V3's 61 layers over 32 stages give ``Et|(tt|)*30L``, the layout
    of Megatron-LM's DeepSeek-V3 guide.

    Raises:
        SpecError: fewer than 2 stages, or fewer slots than stages.
    """
    slots = num_layers + 2
    if num_stages < 2 or slots < num_stages:
        raise SpecError(
            f"balanced_layout: {num_layers} layers + embedding + loss cannot fill "
            f"{num_stages} stages"
        )
    base, extra = divmod(slots, num_stages)
    per_stage = [base + 1] * num_stages
    short = num_stages - extra  # stages holding one slot fewer: last, first, last - 1, ...
    ends = zip(range(num_stages - 1, -1, -1), range(num_stages), strict=True)
    order = [i for pair in ends for i in pair]
    for index in list(dict.fromkeys(order))[:short]:
        per_stage[index] = base
    stages = ["t" * n for n in per_stage]
    stages[0] = "E" + "t" * (per_stage[0] - 1)
    stages[-1] = "t" * (per_stage[-1] - 1) + "L"
    return _compress(stages)


def _compress(stages: list[str]) -> str:
    """Runs of equal middle stages as ``(s|)*N``."""
    out: list[str] = []
    i = 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) - 1 and stages[j + 1] == stages[i] and i > 0:
            j += 1
        run = j - i + 1
        out.append(f"({stages[i]}|)*{run}" if run > 1 else f"{stages[i]}|")
        i = j + 1
    text = "".join(out)
    return text[:-1] if text.endswith("|") else text
