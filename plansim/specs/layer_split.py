"""How a plan splits the model: layers over the pipeline stages (even, or Megatron-LM's
uneven splits), heads over tp, the sequence over cp (pure)."""

from __future__ import annotations

from plansim.errors import SpecError, require_positive_int
from plansim.specs.model import ModelSpec
from plansim.specs.pipeline_layout import balanced_layout, layout_stage_layers
from plansim.specs.plan import ParallelPlan
from plansim.specs.stage_placement import StagePlacement

__all__ = [
    "check_plan_divides_model",
    "pipeline_layer_counts",
    "stage_layer_counts",
    "stage_num_layers",
    "uneven_pipeline_split",
    "uneven_split_fields",
]


def check_plan_divides_model(
    plan: ParallelPlan,
    *,
    num_layers: int,
    num_attention_heads: int,
    num_query_groups: int,
    seq_length: int | None = None,
    has_experts: bool = False,
) -> str | None:
    """Return why ``plan`` cannot split the model, or None when it can.

    Checks: layers split over pp * vpp stages (:func:`pipeline_layer_counts`);
    heads and query groups over tp; with cp > 1, the sequence into 2 * cp chunks (Megatron-LM
    context parallelism gives each cp rank chunks i and 2cp - 1 - i, balancing the causal
    mask; ``get_batch_on_this_cp_rank``). For a vpp that does not divide the layers per rank,
    the reason lists the vpp values that do. ``seq_length`` None skips the cp check. The
    expert degrees (ep, etp) need routed experts (``has_experts``; how they split the
    experts is ``plansim.analytic.moe_layer.moe_split_reason``).
    """
    if not has_experts and (plan.ep > 1 or plan.etp is not None):
        return (
            f"ep({plan.ep}) / etp({plan.etp}) split routed experts, and this model is dense "
            f"(no expert layers): leave ep 1 and etp unset"
        )
    try:
        pipeline_layer_counts(num_layers, plan)
    except SpecError as exc:
        return str(exc)
    if num_attention_heads % plan.tp:
        return f"num_attention_heads({num_attention_heads}) is not divisible by tp({plan.tp})"
    if num_query_groups % plan.tp and plan.tp % num_query_groups:
        return f"num_query_groups({num_query_groups}) and tp({plan.tp}) do not divide one another"
    if seq_length is not None and plan.cp > 1 and seq_length % (2 * plan.cp):
        return (
            f"seq_length({seq_length}) is not divisible by 2 * cp({plan.cp}) = {2 * plan.cp}: "
            f"context parallelism splits each sequence into 2 * cp load-balanced chunks"
        )
    return None


def model_split_reason(plan: ParallelPlan, model: ModelSpec) -> str | None:
    """:func:`check_plan_divides_model` with ``model``'s layers, heads, query groups and
    sequence length: why ``plan`` cannot split ``model``, or None."""
    return check_plan_divides_model(
        plan,
        num_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups,
        seq_length=model.seq_length,
        has_experts=model.moe is not None,
    )


def require_plan_divides_model(plan: ParallelPlan, model: ModelSpec) -> None:
    """Raise SpecError naming the model when ``plan`` cannot split it
    (:func:`model_split_reason`): a usage error before any simulation."""
    reason = model_split_reason(plan, model)
    if reason is not None:
        raise SpecError(f"{model.name}: {reason}")


def pipeline_layer_counts(num_layers: int, plan: ParallelPlan) -> tuple[int, ...]:
    """Transformer layers on each of the ``plan.pp`` pipeline ranks, first rank first.

    Even split L / pp unless the plan sets ``decoder_first_pipeline_num_layers`` or
    ``decoder_last_pipeline_num_layers`` (Megatron-LM's uneven split): those ranks hold that
    many, the other ranks share the rest evenly. Each rank's layers form vpp model chunks of
    equal whole layers, so every count must be a multiple of vpp (Megatron-LM requires the
    same of uneven splits).

    Raises:
        SpecError: the layers do not split that way; the message names the counts that would
            (the vpp values that divide the layers per rank, or an uneven split).
    """
    require_positive_int("num_layers", num_layers)
    if plan.schedule.placement is not StagePlacement.LOOP:  # V or dual: the rank's 2 chunks
        stages = stage_layer_counts(num_layers, plan)
        return tuple(sum(stages[s] for s in plan.stages_of_rank(r)) for r in range(plan.pp))
    if (
        plan.account_for_embedding_in_pipeline_split
        or plan.account_for_loss_in_pipeline_split
        or plan.pipeline_model_parallel_layout is not None
    ):
        stages = stage_layer_counts(num_layers, plan)
        return tuple(sum(stages[r :: plan.pp]) for r in range(plan.pp))
    first, last = plan.decoder_first_pipeline_num_layers, plan.decoder_last_pipeline_num_layers
    if not plan.uneven_pipeline:
        if num_layers % plan.num_stages == 0:
            return (num_layers // plan.pp,) * plan.pp
        reason = (
            f"num_layers({num_layers}) is not divisible by pp({plan.pp}) * vpp({plan.vpp})"
            f" = {plan.num_stages}"
        )
        if plan.vpp > 1 and num_layers % plan.pp == 0:
            per_rank = num_layers // plan.pp
            fits = [str(v) for v in range(2, per_rank + 1) if per_rank % v == 0]
            reason += (
                f": vpp must divide the {per_rank} layers per pipeline rank"
                f" ({', '.join(fits) or 'none above 1'})"
            )
        fields = uneven_split_fields(num_layers, pp=plan.pp, vpp=plan.vpp)
        if fields is not None:
            reason += "; an uneven split fits: " + ", ".join(f"{k}={v}" for k, v in fields.items())
        raise SpecError(reason)
    middle_ranks = plan.pp - (first is not None) - (last is not None)
    middle_layers = num_layers - (first or 0) - (last or 0)
    label = (
        f"num_layers({num_layers}) with decoder_first_pipeline_num_layers({first}) and "
        f"decoder_last_pipeline_num_layers({last}) on pp({plan.pp})"
    )
    if middle_layers < middle_ranks or (middle_ranks == 0 and middle_layers != 0):
        raise SpecError(f"{label}: {middle_layers} layers left for {middle_ranks} other ranks")
    middle = middle_layers // middle_ranks if middle_ranks else 0
    if middle_ranks and middle_layers % middle_ranks:
        raise SpecError(
            f"{label}: the other {middle_ranks} ranks cannot share {middle_layers} layers evenly"
        )
    counts = (
        first if first is not None else middle,
        *([middle] * (plan.pp - 2)),
        last if last is not None else middle,
    )
    bad = sorted({c for c in counts if c % plan.vpp})
    if bad:
        raise SpecError(
            f"{label}: rank layer counts {', '.join(map(str, bad))} are not multiples of "
            f"vpp({plan.vpp}) (each rank's model chunks hold equal whole layers)"
        )
    return counts


def stage_layer_counts(num_layers: int, plan: ParallelPlan) -> tuple[int, ...]:
    """Layers in each of the pp * vpp pipeline stages (model chunks), stage 0 first; stage s
    sits on rank s mod pp (ZB-V, DualPipeV, DualPipe: ``ParallelPlan.stages_of_rank``).

    With ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``
    the embedding / the output layer and loss count as one slot each: L + e + l slots split
    evenly over the stages, stage 0 and the last stage one layer fewer (a stage may be left
    with the embedding or the loss alone). Otherwise each rank's count
    (:func:`pipeline_layer_counts`) over vpp.

    With ``pipeline_model_parallel_layout``: the layers the layout names per stage
    (``plansim.specs.pipeline_layout``).

    Raises:
        SpecError: the layers do not split that way (the message says why).
    """
    require_positive_int("num_layers", num_layers)
    layout = plan.pipeline_model_parallel_layout
    if layout is not None:
        named = layout_stage_layers(layout, num_stages=plan.num_stages)
        if sum(named) != num_layers:
            raise SpecError(
                f"plan.pipeline_model_parallel_layout({layout!r}) holds {sum(named)} layers; "
                f"the model has num_layers({num_layers})"
            )
        return named
    emb = int(plan.account_for_embedding_in_pipeline_split)
    loss = int(plan.account_for_loss_in_pipeline_split)
    if not (emb or loss) and plan.schedule.placement is not StagePlacement.LOOP:
        if num_layers % plan.num_stages:  # V / dual: an even split over the stages
            raise SpecError(
                f"num_layers({num_layers}) is not divisible by the {plan.num_stages} stages "
                f"of schedule {plan.schedule.value} (pp({plan.pp}) * vpp({plan.vpp}))"
            )
        return (num_layers // plan.num_stages,) * plan.num_stages
    if not (emb or loss):  # stage s = chunk k * pp + rank r holds rank r's count / vpp
        per_rank = pipeline_layer_counts(num_layers, plan)
        return tuple(count // plan.vpp for count in per_rank) * plan.vpp
    slots = num_layers + emb + loss
    flags = " + ".join(name for name, on in (("embedding", emb), ("loss", loss)) if on)
    if slots % plan.num_stages:
        raise SpecError(
            f"num_layers({num_layers}) + {flags} = {slots} slots are not divisible by "
            f"pp({plan.pp}) * vpp({plan.vpp}) = {plan.num_stages}"
        )
    per_stage = slots // plan.num_stages
    counts = [per_stage] * plan.num_stages
    counts[0] -= emb
    counts[-1] -= loss
    if min(counts) < 0:
        raise SpecError(
            f"num_layers({num_layers}) + {flags} on pp({plan.pp}) * vpp({plan.vpp}) stages: "
            f"one slot per stage leaves no room for both the embedding and the loss"
        )
    return tuple(counts)


def stage_bf16_layers(num_layers: int, plan: ParallelPlan) -> tuple[tuple[int, int], ...]:
    """Per pipeline stage (model chunk), stage 0 first: (head, tail), how many of its first
    and of its last layers run in bf16 (``plan.num_layers_at_start_in_bf16`` counts from
    the model's first layer, ``num_layers_at_end_in_bf16`` from its last; the stages hold
    the layers in order, as :func:`stage_layer_counts`).

    Raises:
        SpecError: the two counts add up to more than ``num_layers``, or as
            :func:`stage_layer_counts`.
    """
    counts = stage_layer_counts(num_layers, plan)
    start, end = plan.num_layers_at_start_in_bf16, plan.num_layers_at_end_in_bf16
    if start + end > num_layers:
        raise SpecError(
            f"num_layers_at_start_in_bf16({start}) + num_layers_at_end_in_bf16({end}) > "
            f"num_layers({num_layers})"
        )
    if not (start or end):  # no layer kept in bf16 (the common case)
        return ((0, 0),) * len(counts)
    ends: list[tuple[int, int]] = []
    first = 0
    for count in counts:
        last = first + count
        head = max(0, min(last, start) - first)
        tail = max(0, last - max(first, num_layers - end))
        ends.append((head, tail))
        first = last
    return tuple(ends)


def stage_num_layers(num_layers: int, plan: ParallelPlan, stage: int) -> int:
    """Layers in pipeline stage (model chunk) ``stage`` (:func:`stage_layer_counts`).

    Raises:
        SpecError: as :func:`stage_layer_counts`.
    """
    return stage_layer_counts(num_layers, plan)[stage]


def uneven_pipeline_split(num_layers: int, *, pp: int, vpp: int) -> tuple[int, int] | None:
    """(first, last) rank layer counts of the uneven split the planner offers when the
    layers do not split evenly over pp * vpp stages; None when they do, or when no such
    split exists.

    Every middle rank holds c layers, the smallest multiple of vpp with pp * c >= L; the
    d = pp * c - L missing layers come off the edge ranks in multiples of vpp, the larger
    half off the last rank (it also runs the output layer and the loss, the first rank only
    the embedding lookup). For Llama 3 405B (L = 126, pp = 16) this gives 7, 8 x 14, 7:
    Meta's own split (Dubey et al. 2024, §3.3.2: one layer fewer on the first and the last
    stage). Needs pp > 1, L a multiple of vpp and at least vpp layers left on each edge rank.
    """
    if pp < 2 or num_layers % (pp * vpp) == 0 or num_layers % vpp:
        return None
    per_rank = vpp * -(-num_layers // (pp * vpp))
    missing = pp * per_rank - num_layers
    off_first = vpp * ((missing // vpp) // 2)
    first, last = per_rank - off_first, per_rank - (missing - off_first)
    if first < vpp or last < vpp:
        return None
    return first, last


def uneven_split_fields(
    num_layers: int, *, pp: int, vpp: int, layouts: bool = False
) -> dict[str, object] | None:
    """The :class:`ParallelPlan` fields of the uneven split the planner offers when the
    layers do not split evenly over pp * vpp stages, or None (even, or nothing fits).

    First choice: the embedding and the loss each count as a layer
    (``account_for_embedding/loss_in_pipeline_split``) when L + 2 slots split evenly over the
    stages, as Llama 3 405B does (126 + 2 = 16 x 8: Dubey et al. 2024 §3.3.2); it keeps every
    chunk one size, which lets interleaving use more chunks. Else the lighter first and last
    ranks of :func:`uneven_pipeline_split`. Else, with ``layouts``, a layout string that
    spreads the layers, the embedding and the loss over the stages
    (``pipeline_layout.balanced_layout``; Megatron-Core's MoE recipes name their splits so).
    """
    stages = pp * vpp
    if pp < 2 or num_layers % stages == 0:
        return None
    if (num_layers + 2) % stages == 0 and num_layers + 2 >= stages:
        return {
            "account_for_embedding_in_pipeline_split": True,
            "account_for_loss_in_pipeline_split": True,
        }
    split = uneven_pipeline_split(num_layers, pp=pp, vpp=vpp)
    if split is None:
        if layouts and num_layers + 2 >= stages:
            return {
                "pipeline_model_parallel_layout": balanced_layout(num_layers, num_stages=stages)
            }
        return None
    return {
        "decoder_first_pipeline_num_layers": split[0],
        "decoder_last_pipeline_num_layers": split[1],
    }
