"""The search space of a published run: what its blank cells search and what its date and
framework allow (pure).

Knobs: a blank tp, pp, dp, micro-batch size, recompute, ZeRO stage, sequence-parallel or
virtual_pipeline_size cell is searched (the fastest feasible value is used) and the note lists
what was searched and chosen. A stated virtual_pipeline_size v > 1 is simulated with
interleaved 1F1B at vpp = v only; v = 1 with the non-interleaved schedules. A search only
offers what existed when the run was made: the row is dated by its ``framework`` column,
else by its ``source_locator`` (a conference tag such as SC21 or MLSys 2023, or an arXiv id
YYMM.NNNNN). Interleaved 1F1B entered Megatron-LM with Narayanan et al. (SC21,
arXiv:2104.04473, 2021), as did the scatter/gather split of pipeline tensors over the TP
ranks (§4.1; Megatron-LM's 2020 ``training.communicate`` sends the whole (seq, mbs, hidden)
tensor from every rank). Sequence parallelism and selective recompute entered Megatron-LM with
Korthikanti et al. (arXiv:2205.05198, 2022), as did gradient-accumulation fusion into the
weight-gradient GEMM (earlier runs, and the DeepSpeed-based forks of Megatron-LM before
2023, add each micro-batch's gradients in a separate pass);
FlashAttention was published in 2022 (Dao et al.,
arXiv:2205.14135) and became Megatron-LM's default path in 2023, as did asynchronous
pipeline sends (``--overlap-p2p-communication``) and gradient reduction overlapped with
backward (``--overlap-grad-reduce``; Korthikanti et al. 2022 §6.3 state that their runs did
not overlap it). The zero-bubble schedule
ZB-H1 (split backward, Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024,
arXiv:2401.10241, January 2024) is offered to runs dated 2024 or later, except on NVIDIA's
Megatron family (Megatron-LM, Megatron-core, NeMo, Megatron-Bridge), whose only pipeline
schedules are 1F1B and interleaved 1F1B: ``get_forward_backward_func`` in
``megatron/core/pipeline_parallel/schedules.py`` picks no pipelining, 1F1B without or with
interleaving (and, in its latest releases, their "combined 1F1B" variants), with neither
GPipe nor a zero-bubble schedule; those who run ZB-H1 on Megatron patch that function in
their own forks (AMD-AGI/Primus PR #447, 2025; flagos-ai/FlagScale PR #405, 2025;
sail-sg/zero-bubble-pipeline-parallelism). When pp does not
divide the layers, the search splits them unevenly (embedding and loss counted as layers,
or lighter first and last ranks: ``plansim.specs.layer_split.uneven_split_fields``) for a
row that states such a pp, and for a searched pp only where the framework had uneven splits
(DeepSpeed; Megatron-LM from 2024). Rules that follow the framework rather than the date
(DeepSpeed's pipeline engine and ZeRO-3, the DeepSpeed-based forks of Megatron-LM, a ZeRO
stage named only in ``zero_stage_or_sharding``) are in ``plansim.planner.run_framework``.
Runs dated before 2022 price their layer norms' backward as two passes
(``ParallelPlan.persist_layer_norm`` off): Megatron-LM's persistent kernel needs PyTorch
1.11, released in 2022. An undated row is searched over everything. Where the row's source
has a launch script that states a blank knob (micro-batch size, virtual pipeline size,
recompute, PyTorch DDP's overlapped all-reduce: ``plansim.planner.run_scripts``, e.g. SC21's
``examples/sc21/run_table_1.sh``), the script's value is used instead of a search; MosaicML
llm-foundry rows dated before 2024 use its Triton FlashAttention
(``AttentionKernel.FLASH_TRITON``).

Context parallelism (cp; Megatron-LM, Llama 3 §3.3.2): a stated cp is modelled as given
(cp > 1 with FlashAttention whatever the date: Megatron-LM runs cp only through Transformer
Engine's fused attention). A blank cp is searched over 1 and the divisors of the GPU count up
to ``MAX_SEARCHED_CP`` only for sequences of at least ``LONG_CONTEXT_TOKENS`` tokens (where
activations, not weights, fill memory) and FlashAttention; otherwise cp = 1, and the note
says which.
"""

from __future__ import annotations

import re
from dataclasses import replace

from plansim.io.runs import RunRow
from plansim.planner.framework_releases import first_year, undated_note
from plansim.planner.run_framework import (
    bf16_grad_modes,
    deepspeed_pipeline_engine,
    deepspeed_pp,
    framework_recompute,
    framework_tags,
    fused_elementwise,
    has,
    is_llm_foundry,
    is_nvidia_megatron,
    is_torch_fsdp,
    is_torchtitan,
    min_interleaved_pp,
    recompute_early_stop,
    row_framework,
    uneven_pipeline,
    zero3_fetch,
    zero_stage,
    zero_stages,
)
from plansim.planner.run_model import Skip
from plansim.planner.run_scripts import ScriptFacts, script_facts
from plansim.planner.space import SearchSpace
from plansim.specs.plan import (
    AttentionKernel,
    DdpImpl,
    ExecutionSpec,
    Precision,
    Recompute,
    Schedule,
)

#: A blank cp is searched only for sequences at least this long (long-context training).
LONG_CONTEXT_TOKENS = 16384
#: Largest cp tried for a blank cp cell (a ring inside one 8-GPU node with tp = 1).
MAX_SEARCHED_CP = 8


def _fixed(row: RunRow, column: str, notes: list[str], label: str) -> tuple[int, ...] | None:
    value = row.integer(column)
    if value is None:
        notes.append(f"{label} searched")
        return None
    return (value,)


#: An NGC container release named in ``framework`` ("NeMo 24.07", "Megatron-Bridge 25.11",
#: "nvcr.io/nvidia/pytorch:20.12-py3"): NVIDIA numbers its containers YY.MM.
_CONTAINER_RELEASE = re.compile(
    r"(?:nemo|megatron[- ]?bridge|pytorch)\S*[ :]v?(\d\d)\.(?:0[1-9]|1[0-2])\b", re.IGNORECASE
)


def run_year(row: RunRow) -> int | None:
    """Year the run was made: from ``framework`` ("Megatron-LM (2021)", or an NGC container
    release "NeMo 24.07"), else from ``source_locator`` ("SC21", "MLSys 2023",
    "arXiv:2104.04473"), else from the launch script the locator cites
    (``plansim.planner.run_scripts``); None when undated."""
    framework = row.text("framework") or ""
    match = re.search(r"\b(20\d\d)\b", framework)
    if match:
        return int(match.group(1))
    release = _CONTAINER_RELEASE.search(framework)
    if release:
        return 2000 + int(release.group(1))
    locator = row.text("source_locator") or ""
    for pattern, fmt in (
        (r"\b(?:SC|ISCA|MLSys|NSDI|OSDI|SOSP|ATC|EuroSys|PPoPP)[ \'’]?(\d\d)\b", "20{}"),
        (r"\b(20\d\d)\b", "{}"),
        (r"arXiv:(\d\d)\d\d\.\d{4,5}", "20{}"),
    ):
        found = re.search(pattern, locator)
        if found:
            return int(fmt.format(found.group(1)))
    facts = script_facts(row)
    return facts.year if facts else None


def _attention(row: RunRow, year: int | None, notes: list[str]) -> AttentionKernel:
    """FlashAttention where the row's framework had it (``framework_releases``,
    ``flash_attention``); before, llm-foundry's Triton FlashAttention, elsewhere unfused."""
    if has(row, "flash_attention", year):
        return AttentionKernel.FLASH
    if is_llm_foundry(row):
        notes.append(f"Triton FlashAttention (llm-foundry attn_impl: triton, run dated {year})")
        return AttentionKernel.FLASH_TRITON
    notes.append(f"unfused attention (run dated {year})")
    return AttentionKernel.UNFUSED


def _persist_layer_norm(row: RunRow, year: int | None, notes: list[str]) -> bool:
    """Whether the norms' backward is one pass (``ParallelPlan.persist_layer_norm``): not
    for runs dated before PyTorch 1.11 (``framework_releases``, ``persist_layer_norm``)."""
    if not has(row, "persist_layer_norm", year):
        notes.append(f"two-pass layer norm backward (run dated {year}, before PyTorch 1.11)")
        return False
    return True


def row_space(row: RunRow, notes: list[str]) -> SearchSpace:
    """The search space of a runs-CSV row: the knobs it states fixed, blank ones searched
    within what the row's framework and year allow (module docstring); ``notes`` gets each
    knob that was derived or searched, in order.

    Raises:
        Skip: a precision or recompute plansim does not model.
    """
    facts = script_facts(row)
    precision, recompute, zero, sp = _stated_knobs(row, facts, notes)
    year = run_year(row)
    if year is None:
        note = undated_note(row.text("framework") or "", framework_tags(row))
        notes += [note] if note else []
    attention, cps = _attention_and_cps(row, year, notes)
    modern = has(row, "sequence_parallel", year)
    vpps, schedules = _pipeline_schedule(row, year, notes, facts=facts)
    interleave_from = min_interleaved_pp(row, year)
    if vpps is None and interleave_from > 2:
        notes.append(f"interleaving only with pp >= {interleave_from} (Megatron-LM before 2024)")
    torch_fsdp = is_torch_fsdp(row, notes)
    layout = {  # in this order: each may add a note
        "tp": _fixed(row, "tp", notes, "tp"),
        "cp": cps,
        "pp": deepspeed_pp(row, zero, notes),
        "dp": _fixed(row, "dp", notes, "dp"),
        "micro_batch_size": _micro_batch_sizes(row, facts, notes),
        "zero_stages": zero_stages(row, zero, year, notes),
    }
    space = SearchSpace(
        vpps=vpps,
        min_interleaved_pp=interleave_from,
        schedules=schedules,
        **layout,  # type: ignore[arg-type]
        recomputes=_recomputes(row, recompute, modern=modern, attention=attention),
        sequence_parallel=(sp,) if sp is not None else ((False, True) if modern else (False,)),
        overlap_p2p_comm=(False, True) if has(row, "overlap_p2p_comm", year) else (False,),
        overlap_grad_reduce=_overlap_grad_reduce(row, year, facts, notes),
        execution=row_execution(row, year, facts, attention=attention, notes=notes),
        precision=precision,
        grad_reduce_in_bf16=bf16_grad_modes(row, year, notes, torch_fsdp=torch_fsdp),
        zero3_param_fetch=zero3_fetch(row, year, notes),
        use_torch_fsdp2=torch_fsdp,
        recompute_early_stop=recompute_early_stop(row, recompute, notes),
        uneven_pipeline=uneven_pipeline(row, year),
        # Megatron-LM's block method (--recompute-method block) came with selective
        # recompute (Korthikanti et al. 2022's release); a stated "full" is every layer.
        partial_recompute=recompute is None and modern,
    )
    if torch_fsdp and space.zero_stages == (2,):  # the schema: shard-grad-op = 2
        notes.append(
            "PyTorch FSDP shard-grad-op (zero_stage 2): ZeRO-3 with each layer kept gathered "
            "from its forward to its backward"
        )
        return replace(space, zero_stages=(3,), reshard_after_forward=(False,))
    return space


def row_execution(
    row: RunRow,
    year: int | None,
    facts: ScriptFacts | None,
    *,
    attention: AttentionKernel,
    notes: list[str],
) -> ExecutionSpec:
    """The execution spec a row's framework and date give its plans: the framework
    (``run_framework.row_framework``), the attention kernel, gradient-accumulation fusion
    (Megatron-LM from 2022, not the DeepSpeed forks before 2023), the elementwise kernels
    (``run_framework.fused_elementwise``), the layer-norm backward (:func:`_persist_layer_norm`),
    pipeline scatter/gather (Megatron-LM from 2021) and the DDP wrapper (:func:`_ddp_impl`);
    ``notes`` gets the notes of the DDP wrapper, elementwise kernels and layer norm, in that
    order."""
    ddp_impl = _ddp_impl(row, year, facts, notes)
    return ExecutionSpec(
        framework=row_framework(row, year),
        attention=attention,
        gradient_accumulation_fusion=has(row, "gradient_accumulation_fusion", year),
        fused_elementwise=fused_elementwise(row, notes),
        persist_layer_norm=_persist_layer_norm(row, year, notes),
        scatter_gather_p2p=has(row, "scatter_gather_p2p", year),
        ddp_impl=ddp_impl,
    )


def _stated_knobs(
    row: RunRow, facts: ScriptFacts | None, notes: list[str]
) -> tuple[Precision, str | None, int | None, bool | None]:
    """The row's precision, recompute, ZeRO stage and sequence parallelism (None: searched,
    noted).

    Raises:
        Skip: a precision or recompute plansim does not model.
    """
    precision_text = row.choice("precision") or ""
    if precision_text not in {p.value for p in Precision}:
        raise Skip(f"precision {precision_text or 'blank'} not modelled")
    recompute = _recompute_choice(row, facts, notes)
    zero = zero_stage(row, notes)
    sp = row.flag("sequence_parallel")
    for label, value in (("recompute", recompute), ("zero_stage", zero), ("sp", sp)):
        if value is None:
            notes.append(f"{label} searched")
    if recompute is not None and recompute not in {r.value for r in Recompute}:
        raise Skip(f"recompute {recompute!r} not modelled")
    return Precision(precision_text), recompute, zero, sp


def _recompute_choice(row: RunRow, facts: ScriptFacts | None, notes: list[str]) -> str | None:
    """The row's recompute, else its launch script's, as the framework runs it
    (``framework_recompute``); None: searched."""
    recompute = row.choice("recompute")
    if recompute is None and facts is not None and facts.recompute is not None:
        recompute = facts.recompute
        notes.append(f"recompute {recompute} from {facts.source}")
    return framework_recompute(row, recompute, notes)


def _attention_and_cps(
    row: RunRow, year: int | None, notes: list[str]
) -> tuple[AttentionKernel, tuple[int, ...]]:
    """The attention kernel (flash wherever the row states cp > 1, as context parallelism
    needs) and the cp sizes to search."""
    stated_cp = row.integer("cp")
    if stated_cp is not None and stated_cp > 1:
        attention = AttentionKernel.FLASH
        notes.append(f"cp {stated_cp} (flash attention, as context parallelism needs)")
    else:
        attention = _attention(row, year, notes)
    return attention, _cp_values(row, stated_cp, attention, notes)


def _micro_batch_sizes(
    row: RunRow, facts: ScriptFacts | None, notes: list[str]
) -> tuple[int, ...] | None:
    """The stated micro-batch size, else the launch script's, else None (searched)."""
    if row.integer("micro_batch_size_seqs") is None and facts and facts.micro_batch_size:
        notes.append(f"mbs {facts.micro_batch_size} from the launch script")
        return (facts.micro_batch_size,)
    return _fixed(row, "micro_batch_size_seqs", notes, "mbs")


def _ddp_impl(
    row: RunRow, year: int | None, facts: ScriptFacts | None, notes: list[str]
) -> DdpImpl:
    """The data-parallel wrapper (``ParallelPlan.ddp_impl``): the launch script's
    ``--DDP-impl``; else Megatron-LM's legacy local DDP for NVIDIA Megatron-family runs
    dated before Megatron-core's DDP (``framework_releases``, ``megatron_core_ddp``; its
    default ``--DDP-impl local``); else
    Megatron-core's."""
    if facts is not None and facts.ddp_impl is not None:
        notes.append(f"DDP {facts.ddp_impl} (the launch script's --DDP-impl)")
        return DdpImpl(facts.ddp_impl)
    if is_nvidia_megatron(row) and not has(row, "megatron_core_ddp", year):
        since = first_year("megatron_core_ddp", framework_tags(row))
        notes.append(f"DDP local (Megatron-LM's --DDP-impl default before {since})")
        return DdpImpl.LOCAL
    return DdpImpl.MEGATRON_CORE


def _overlap_grad_reduce(
    row: RunRow, year: int | None, facts: ScriptFacts | None, notes: list[str]
) -> tuple[bool, ...]:
    """Overlapped DP gradient reduction: on when the launch script runs PyTorch DDP
    (``ScriptFacts.overlap_grad_reduce``), searched where the framework had it
    (``framework_releases``, ``overlap_grad_reduce``: Megatron-LM ``--overlap-grad-reduce``;
    undated rows), else off."""
    if facts is not None and facts.overlap_grad_reduce:
        notes.append("DP all-reduce overlapped with backward (PyTorch DDP, from the launch script)")
        return (True,)
    return (False, True) if has(row, "overlap_grad_reduce", year) else (False,)


def _recomputes(
    row: RunRow, stated: str | None, *, modern: bool, attention: AttentionKernel
) -> tuple[Recompute, ...]:
    """The stated recompute, else none and full, plus Megatron's selective where it differs
    from none (where the framework had it, ``framework_releases`` ``sequence_parallel``;
    unfused attention: with FlashAttention it
    only costs) and torchtitan's per-op policy on torchtitan rows (flash attention)."""
    if stated:
        return (Recompute(stated),)
    searched: tuple[Recompute, ...] = (Recompute.NONE, Recompute.FULL)
    if modern and attention is AttentionKernel.UNFUSED:
        searched += (Recompute.SELECTIVE,)
    if is_torchtitan(row) and attention is AttentionKernel.FLASH:
        searched += (Recompute.SELECTIVE_OP,)
    return searched


def _cp_values(
    row: RunRow, stated: int | None, attention: AttentionKernel, notes: list[str]
) -> tuple[int, ...]:
    """cp values to search: the stated one; for a blank cell 1 plus the divisors of num_gpus
    up to MAX_SEARCHED_CP when the sequence has at least LONG_CONTEXT_TOKENS tokens and
    attention is flash, else 1 (noted)."""
    if stated is not None:
        return (stated,)
    seq = row.integer("seq_len_tokens") or 0
    if seq < LONG_CONTEXT_TOKENS:
        notes.append(f"cp blank: 1 (seq_len {seq} < {LONG_CONTEXT_TOKENS})")
        return (1,)
    if attention is not AttentionKernel.FLASH:
        notes.append("cp blank: 1 (context parallelism needs flash attention)")
        return (1,)
    gpus = row.integer("num_gpus") or 1
    values = tuple(c for c in range(1, MAX_SEARCHED_CP + 1) if gpus % c == 0)
    notes.append(
        f"cp searched ({', '.join(map(str, values))}; seq_len {seq} >= {LONG_CONTEXT_TOKENS})"
    )
    return values


def _pipeline_schedule(
    row: RunRow, year: int | None, notes: list[str], *, facts: ScriptFacts | None = None
) -> tuple[tuple[int, ...] | None, tuple[Schedule, ...]]:
    """(vpps, schedules) to search: a stated virtual_pipeline_size v > 1 means interleaved 1F1B
    with vpp = v only; v = 1 the non-interleaved schedules; blank searches vpp (interleaving
    only for runs dated from its introduction on). The non-interleaved schedules are 1F1B
    alone on NVIDIA's Megatron family and DeepSpeed's pipeline engine; elsewhere 1F1B and
    GPipe, and ZB-H1 where the framework had it (``framework_releases``, ``zero_bubble``;
    undated rows too) (module
    docstring). ``facts``: the row's launch script (:func:`script_facts`; read here when not
    given), whose vpp fills a blank cell."""
    flat: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.GPIPE)
    if is_nvidia_megatron(row):
        flat = (Schedule.ONE_F_ONE_B,)
        if row.integer("pp") != 1:
            notes.append("1F1B or interleaved 1F1B (Megatron-LM's only pipeline schedules)")
    elif deepspeed_pipeline_engine(row):
        flat = (Schedule.ONE_F_ONE_B,)  # TrainSchedule, also with a stated vpp of 1
    elif has(row, "zero_bubble", year):
        flat += (Schedule.ZB_H1,)
    vpp = row.integer("virtual_pipeline_size")
    facts = facts or script_facts(row)
    if vpp is None and facts is not None and facts.virtual_pipeline_size is not None:
        vpp = facts.virtual_pipeline_size
        notes.append(f"vpp {vpp} from the launch script")
    if vpp is not None:
        return (vpp,), ((Schedule.INTERLEAVED_1F1B,) if vpp > 1 else flat)
    if deepspeed_pipeline_engine(row):
        notes.append("1F1B (DeepSpeed's pipeline engine has no other training schedule)")
        return (1,), (Schedule.ONE_F_ONE_B,)
    if not has(row, "interleaved_1f1b", year):
        return (1,), flat
    notes.append("vpp searched")
    return None, (*flat, Schedule.INTERLEAVED_1F1B)
