"""Context parallelism (cp): validation, rank groups, activations, ring attention, DP x CP.

Megatron-LM / Llama 3 (Dubey et al. 2024 §3.3.2) context parallelism with ring attention
(Liu et al. 2023): each cp rank holds s/cp tokens of every sequence, attention passes K/V
chunks around the cp ring, gradients are reduced over dp * cp ranks. Expected values are
worked out by hand on the round-number profile (tests/unit/synthetic.py: 100 TFLOP/s,
HBM 1000 GB/s, intra-node 100 GB/s + 10 us, NIC 10 GB/s + 5 us).
"""

from __future__ import annotations

import itertools

import pytest

from plansim.analytic.activations import full_layer_bytes, layer_activations, ring_kv_chunk_bytes
from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.layer_cost import layer_gemms, layer_pass_times
from plansim.analytic.memory import rank_memory, rank_parameters, transient_bytes
from plansim.analytic.op_overheads import FLASH_FRACTION_OF_GEMM
from plansim.analytic.ranks import GroupSpan, layout_groups
from plansim.analytic.stored_activations import microbatch_activation_bytes
from plansim.analytic.zero3 import edge_param_tensors, layer_param_tensors
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.backtest import Prediction, predict_row
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.planner.evaluate import Evaluation, check_plan, evaluate
from plansim.specs.hardware import LinkTier
from plansim.specs.layer_split import check_plan_divides_model
from plansim.specs.model import Activation, ModelSpec
from plansim.specs.plan import (
    AttentionKernel,
    ExecutionSpec,
    ParallelPlan,
    Recompute,
    plan_from_fields,
)
from tests.unit.synthetic import round_profile

US = 1e-6
GPT3 = resolve_model("gpt3-175b")  # h 12288, a 96, s 2048, MHA, GELU ffn 4h

#: MHA, head_dim 128, s = 8192: attention-heavy enough for hand-worked ring timings.
RING = ModelSpec(
    name="ring",
    num_layers=2,
    hidden_size=1024,
    num_attention_heads=8,
    num_query_groups=8,
    ffn_hidden_size=4096,
    activation=Activation.GELU,
    seq_length=8192,
    vocab_size=1024,
    tied_embeddings=True,
)


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = {"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": 1}
    base.update(kw)
    base.setdefault("global_batch_size", base["micro_batch_size"] * base["dp"])
    return plan_from_fields(**base)


# --- validation --------------------------------------------------------------------------


def test_cp_plans_build_and_need_flash_attention() -> None:
    plan = _plan(cp=4, dp=2)
    assert plan.num_gpus == 8 and plan.num_microbatches == 1 and "cp4" in plan.label()
    with pytest.raises(SpecError, match=r"plan\.cp\(2\) needs attention flash \(got unfused\)"):
        _plan(cp=2, attention=AttentionKernel.UNFUSED)
    with pytest.raises(SpecError, match=r"plan\.cp must be a positive integer, got 0"):
        _plan(cp=0)


def test_sequence_must_split_into_2cp_chunks() -> None:
    def reason(cp: int, seq: int | None) -> str | None:
        return check_plan_divides_model(
            _plan(cp=cp), num_layers=4, num_attention_heads=8, num_query_groups=8, seq_length=seq
        )

    assert reason(3, 4096) == (
        "seq_length(4096) is not divisible by 2 * cp(3) = 6: context parallelism splits "
        "each sequence into 2 * cp load-balanced chunks"
    )
    assert reason(4, 4096) is None and reason(1, 4095) is None and reason(3, None) is None
    # evaluate.check_plan passes the model's sequence length
    model = ModelSpec(**{**_fields(RING), "seq_length": 8190})
    rejected = check_plan(model, _plan(cp=2), round_profile())
    assert rejected is not None and "2 * cp(2) = 4" in rejected.reason


def _fields(model: ModelSpec) -> dict[str, object]:
    return {name: getattr(model, name) for name in ModelSpec.__slots__}


# --- rank groups -------------------------------------------------------------------------


def _groups_by_brute_force(
    tp: int, cp: int, dp: int, pp: int, *, gpus_per_node: int
) -> dict[str, GroupSpan]:
    """Spans of rank 0's groups from global rank = t + tp*(c + cp*(d + dp*p))."""
    rank = {
        (t, c, d, p): t + tp * (c + cp * (d + dp * p))
        for t, c, d, p in itertools.product(range(tp), range(cp), range(dp), range(pp))
    }
    varying = {
        "tp": lambda t, c, d, p: c == d == p == 0,
        "cp": lambda t, c, d, p: t == d == p == 0,
        "dp": lambda t, c, d, p: t == c == p == 0,
        "dp_cp": lambda t, c, d, p: t == p == 0,
        "pp": lambda t, c, d, p: t == c == d == 0,
    }
    spans = {}
    for kind, member in varying.items():
        ranks = [r for key, r in rank.items() if member(*key)]
        nodes = [r // gpus_per_node for r in ranks]
        spans[kind] = GroupSpan(
            size=len(ranks),
            members_per_node=max(nodes.count(n) for n in set(nodes)),
            num_nodes=len(set(nodes)),
        )
    return spans


def test_rank_groups_tp2_cp2_dp2_pp2_on_4_gpu_nodes() -> None:
    # ranks.py docstring: CP {0,2}, DP {0,4}, DP x CP {0,2,4,6}, PP {0,8} with 4 GPUs/node.
    groups = layout_groups(_plan(tp=2, cp=2, dp=2, pp=2), gpus_per_node=4)
    assert groups.tp == GroupSpan(size=2, members_per_node=2, num_nodes=1)
    assert groups.cp == GroupSpan(size=2, members_per_node=2, num_nodes=1)
    assert groups.dp == GroupSpan(size=2, members_per_node=1, num_nodes=2)
    assert groups.dp_cp == GroupSpan(size=4, members_per_node=2, num_nodes=2)
    assert groups.pp == GroupSpan(size=2, members_per_node=1, num_nodes=2)
    assert groups.cp.tier is LinkTier.INTRA_NODE and groups.dp_cp.tier is LinkTier.INTER_NODE
    brute = _groups_by_brute_force(2, 2, 2, 2, gpus_per_node=4)
    for kind, span in brute.items():
        assert getattr(groups, kind) == span, kind


@pytest.mark.parametrize(
    ("tp", "cp", "dp", "pp", "gpn"),
    [(4, 4, 2, 1, 8), (8, 2, 2, 2, 8), (1, 8, 2, 1, 8), (2, 4, 1, 2, 8), (1, 2, 4, 2, 4)],
)
def test_rank_groups_match_brute_force(tp: int, cp: int, dp: int, pp: int, gpn: int) -> None:
    groups = layout_groups(_plan(tp=tp, cp=cp, dp=dp, pp=pp), gpus_per_node=gpn)
    for kind, span in _groups_by_brute_force(tp, cp, dp, pp, gpus_per_node=gpn).items():
        assert getattr(groups, kind) == span, kind
    # the cp ring stays inside a node exactly when tp * cp <= GPUs per node
    assert (groups.cp.tier is LinkTier.INTRA_NODE) == (tp * cp <= gpn)


# --- activations -------------------------------------------------------------------------


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_korthikanti_eq4_with_s_over_cp(cp: int) -> None:
    # Eq. 4 (TP + SP, unfused core): (s/cp)*b*h/t * (34 + 5*a*s/h); the key length in the
    # core term stays s (local queries over all keys), so the whole is the cp = 1 value / cp.
    s, h, a, t = 2048, 12288, 96, 8
    expected = (s / cp) * h / t * (34 + 5 * a * s / h)
    got = full_layer_bytes(
        GPT3, micro_batch_size=1, tp=t, sequence_parallel=True, flash=False, cp=cp
    )
    assert got == pytest.approx(expected, rel=1e-12)
    one = full_layer_bytes(GPT3, micro_batch_size=1, tp=t, sequence_parallel=True, flash=False)
    assert got == pytest.approx(one / cp, rel=1e-12)


@pytest.mark.parametrize("recompute", list(Recompute))
@pytest.mark.parametrize(
    ("sp", "flash"), [(False, False), (True, False), (True, True), (False, True)]
)
def test_every_recompute_mode_scales_by_one_over_cp(
    recompute: Recompute, sp: bool, flash: bool
) -> None:
    kw = {"micro_batch_size": 2, "tp": 4, "sequence_parallel": sp, "recompute": recompute}
    one = layer_activations(GPT3, flash=flash, **kw)
    four = layer_activations(GPT3, flash=flash, cp=4, **kw)
    assert four.stored_bytes == pytest.approx(one.stored_bytes / 4, rel=1e-12)
    assert four.working_bytes == pytest.approx(one.working_bytes / 4, rel=1e-12)
    if recompute is Recompute.FULL:  # layer input only: 2*(s/cp)*b*h/(t if SP)
        assert four.stored_bytes == 2 * 512 * 2 * 12288 / (4 if sp else 1)


def test_plan_activations_and_ring_buffers() -> None:
    llama = resolve_model("llama3-8b", seq_length=16384)  # 8 KV heads, head_dim 128
    one = _plan(tp=2, pp=2, micro_batch_size=1, recompute=Recompute.FULL)
    two = _plan(tp=2, pp=2, cp=2, micro_batch_size=1, recompute=Recompute.FULL)
    for rank in (0, 1):  # embedding output on rank 0 included
        per_mb_one = microbatch_activation_bytes(llama, one, rank=rank)
        assert microbatch_activation_bytes(llama, two, rank=rank) == pytest.approx(per_mb_one / 2)
    # K, V chunk: 2 * (16384/2) tokens * 1 seq * (8/2 groups * 128) * 2 B = 16 MiB
    chunk = ring_kv_chunk_bytes(llama, micro_batch_size=1, tp=2, cp=2)
    assert chunk == 2 * 8192 * 512 * 2 == 16 * 2**20
    # transient on the last rank: (working set + logits) / cp + max(cp, 4) ring chunks
    last_one = transient_bytes(llama, one, rank=1)
    assert transient_bytes(llama, two, rank=1) == pytest.approx(last_one / 2 + 4 * chunk)


# --- ring traffic and exposed time -------------------------------------------------------


def test_ring_kv_chunk_bytes_hand_computed() -> None:
    # 2 (K, V) * (s/cp) * b * local KV width * 2 B
    gqa = ModelSpec(**{**_fields(RING), "num_query_groups": 2})  # kv width 256
    assert ring_kv_chunk_bytes(RING, micro_batch_size=1, tp=1, cp=1) == 0.0
    assert ring_kv_chunk_bytes(RING, micro_batch_size=1, tp=2, cp=4) == 2 * 2048 * 512 * 2
    assert ring_kv_chunk_bytes(RING, micro_batch_size=2, tp=1, cp=2) == 2 * 4096 * 2 * 1024 * 2
    assert ring_kv_chunk_bytes(gqa, micro_batch_size=1, tp=1, cp=2) == 2 * 4096 * 256 * 2
    # tp 8 > 2 groups: one replicated KV head (width 128) per TP rank
    assert ring_kv_chunk_bytes(gqa, micro_batch_size=1, tp=8, cp=2) == 2 * 4096 * 128 * 2


def test_ring_bytes_per_layer_forward_and_backward() -> None:
    # cp 4, tp 2: chunk C = 2 * 2048 * 512 * 2 = 4 MiB; forward (cp-1) C, backward 2(cp-1) C
    plan = _plan(tp=2, cp=4)
    prof = round_profile()
    times = layer_pass_times(RING, plan, prof, layout_groups(plan, gpus_per_node=8))
    assert times.cp_forward_bytes == 3 * 4 * 2**20
    assert times.cp_backward_bytes == 6 * 4 * 2**20


def test_attention_core_and_linear_gemms_per_cp_rank() -> None:
    # linear m = b*s/cp; attention core: local queries over all keys, 1/cp of the FLOPs
    plan = _plan(cp=4)
    gemms = {g.name: g for g in layer_gemms(RING, plan)}
    assert gemms["qkv"].m == 2048 and gemms["mlp_down"].m == 2048
    assert (gemms["attn_scores"].m, gemms["attn_scores"].n, gemms["attn_scores"].count) == (
        2048,
        8192,
        8,
    )
    assert (gemms["attn_over_v"].m, gemms["attn_over_v"].k) == (2048, 8192)
    full = {g.name: g for g in layer_gemms(RING, _plan())}
    for name in ("attn_scores", "attn_over_v", "qkv", "mlp_up"):
        assert gemms[name].flops * 4 == full[name].flops


def _ring_times(cp: int, *, gpus_per_node: int) -> tuple[float, float]:
    plan = _plan(cp=cp)
    groups = layout_groups(plan, gpus_per_node=gpus_per_node)
    times = layer_pass_times(RING, plan, round_profile(gpus_per_node=gpus_per_node), groups)
    return times.cp_forward_s, times.cp_backward_s


#: The fused attention call's rate on the round-number profile without a measured curve:
#: FLASH_FRACTION_OF_GEMM (0.5752) x its flat 100 TFLOP/s GEMM rate (op_overheads).
FLASH_RATE = FLASH_FRACTION_OF_GEMM * 100e12


def test_ring_hidden_inside_a_node() -> None:
    # cp 2, tp 1, 8 GPUs/node: ring on NVLink. Attention core per rank (8 heads): scores
    # m 4096, n 8192, k 128 -> 2*4096*8192*128*8 = 68.72 GFLOP, attn_over_v the same; the
    # fused call does the causal half, 68.72 GFLOP, at 57.52 TFLOP/s: core forward 1194.66 us,
    # per ring step 597.33 us. K/V chunk C = 2*4096*1024*2 = 16.78 MB:
    # T(C) = 10 us + 16.78 MB / 100 GB/s = 177.77 us < 597.33 us -> fully hidden.
    assert _ring_times(2, gpus_per_node=8) == (0.0, 0.0)


def test_ring_exposed_across_nodes_cp2() -> None:
    # Same plan, one GPU per node: the ring hop is a NIC, T(C) = 5 us + 16.777216 MB / 10 GB/s
    # = 1682.7216 us. Forward: (cp-1) * (1682.7216 - 597.33084) = 1085.39076 us exposed.
    # Backward (2.5 x core = 2986.65 us, per step 1493.33 us): two transfers of C,
    # 2 * (1682.7216 - 1493.32709) = 378.78902 us.
    fwd, bwd = _ring_times(2, gpus_per_node=1)
    core = 2 * 4096 * 8192 * 128 * 8 / FLASH_RATE  # the causal half of the two core GEMMs
    t_c = 5 * US + 16_777_216 / 10e9
    assert fwd == pytest.approx(t_c - core / 2, rel=1e-12)
    assert fwd == pytest.approx(1085.39076 * US, rel=1e-8)
    assert bwd == pytest.approx(2 * (t_c - 2.5 * core / 2), rel=1e-12)
    assert bwd == pytest.approx(378.78902 * US, rel=1e-8)


def test_ring_exposed_across_nodes_cp4() -> None:
    # cp 4 on 1-GPU nodes. Core per rank: the causal half of 2 GEMMs of
    # 2*2048*8192*128*8 = 34.36 GFLOP at 57.52 TFLOP/s = 597.33 us; per step forward
    # 149.33 us, backward 2.5 x 597.33 / 4 = 373.33 us.
    # C = 2*2048*1024*2 = 8.39 MB: T(C) = 5 + 838.8608 = 843.8608 us; T(2C) = 1682.7216 us.
    # forward: 3 * (843.8608 - 149.33271) = 2083.58427 us
    # backward: 2 * (843.8608 - 373.33177) + (4 - 2) * (1682.7216 - 373.33177) = 3559.83771 us
    fwd, bwd = _ring_times(4, gpus_per_node=1)
    core = 2 * 2048 * 8192 * 128 * 8 / FLASH_RATE
    t1, t2 = 5 * US + 8_388_608 / 10e9, 5 * US + 16_777_216 / 10e9
    assert fwd == pytest.approx(3 * (t1 - core / 4), rel=1e-12)
    assert bwd == pytest.approx(2 * (t1 - 2.5 * core / 4) + 2 * (t2 - 2.5 * core / 4), rel=1e-12)
    assert (fwd, bwd) == pytest.approx((2083.58427 * US, 3559.83771 * US), rel=1e-8)


def test_exposed_ring_time_reaches_the_stage_work_and_the_timeline() -> None:
    # RING has 2 layers on one stage: forward cp_comm = 2 x 1085.39 us, on the blocking "tp"
    # stream; full recompute repeats it; backward exposes 2 x 378.79 us more.
    prof = round_profile(gpus_per_node=1)
    plan = _plan(cp=2, recompute=Recompute.FULL)
    work = build_pipeline_work(RING, plan, prof)
    stage = work.stages[0]
    fwd = [s for s in stage.forward if s.kind == "cp_comm"]
    assert len(fwd) == 1 and fwd[0].stream == "tp"
    assert fwd[0].duration_s == pytest.approx(2 * 1085.39076 * US, rel=1e-8)
    assert fwd[0].num_bytes == 2 * 16_777_216
    rec = [s.duration_s for s in stage.backward if s.kind == "cp_comm"]
    assert rec == pytest.approx([fwd[0].duration_s, 2 * 378.78902 * US], rel=1e-8)
    assert [s.kind for s in stage.backward_input].count("cp_comm") == 2
    ev = evaluate(RING, plan, prof)
    assert isinstance(ev, Evaluation)
    exposed = 4 * 1085.39076 + 2 * 378.78902
    assert ev.exposed_comm_s_by_kind["cp_comm"] == pytest.approx(exposed * US, rel=1e-8)
    hidden = build_pipeline_work(RING, plan, round_profile(gpus_per_node=8))
    assert all(s.kind != "cp_comm" for s in hidden.stages[0].forward + hidden.stages[0].backward)


# --- gradients over dp x cp --------------------------------------------------------------


def test_zero1_optimizer_shard_divides_by_dp_times_cp() -> None:
    prof = round_profile()
    plan = _plan(dp=2, cp=2, zero_stage=1)
    params = rank_parameters(RING, plan, rank=0)
    mem = rank_memory(RING, plan, prof, rank=0)
    assert mem.optimizer_bytes == pytest.approx(params * 12 / 4, rel=1e-12)  # bf16: 12 B/param
    assert mem.weights_bytes == params * 2 and mem.gradients_bytes == params * 4
    zero2 = rank_memory(RING, _plan(dp=2, cp=2, zero_stage=2), prof, rank=0)
    assert zero2.gradients_bytes == pytest.approx(params * 4 / 4, rel=1e-12)


def test_gradient_reduction_runs_over_dp_times_cp() -> None:
    # tp 1, cp 2, dp 2 on an 8-GPU node: reduce-scatter over 4 ranks, 10 us + 3/4 * G / 100 GB/s
    # with G = params * 4 B (fp32 main grads); the ZeRO-1 all-gather of 16-bit params likewise.
    prof = round_profile()
    plan = _plan(dp=2, cp=2, zero_stage=1)
    grad_bytes = rank_parameters(RING, plan, rank=0) * 4
    rank = build_pipeline_work(RING, plan, prof).ranks[0]
    (sync,) = rank.grad_sync
    assert sync.duration_s == pytest.approx(10 * US + 0.75 * grad_bytes / 100e9, rel=1e-12)
    gather = [s for s in rank.optimizer if s.kind == "dp_comm"]
    assert gather[0].duration_s == pytest.approx(10 * US + 0.75 * grad_bytes / 2 / 100e9)
    # Adam over the local shard: 42 B per parameter (adam_step_bytes) of params / (dp * cp),
    # and Megatron-core's 1/(dp * cp) scaling pass over the whole fp32 buffer (read + write)
    (adam,) = [s for s in rank.optimizer if s.kind == "optimizer"]
    want_adam = (42 * grad_bytes / 4 / 4 + 2 * grad_bytes) / 1000e9
    assert adam.duration_s == pytest.approx(want_adam, rel=1e-12)
    # ZeRO-3: per micro-batch all-gathers of the 16-bit params over the 4 dp x cp ranks; with
    # layer prefetch the embedding/output unit and the first layer's gather are exposed
    z3_plan = _plan(dp=2, cp=2, zero_stage=3)
    zero3 = build_pipeline_work(RING, z3_plan, prof).stages[0]
    (ag,) = [s for s in zero3.forward if s.kind == "dp_comm"]
    edge = sum(edge_param_tensors(RING, z3_plan, first=True, last=True))
    layer = sum(layer_param_tensors(RING, z3_plan))
    # (+ the flat-buffer copies: read + write of the shard and of the gathered unit, 2 B each,
    # at the streaming 1000 GB/s)
    want = sum(
        10 * US + 0.75 * 2 * numel / 100e9 + 2 * 2 * (numel / 4 + numel) / 1000e9
        for numel in (edge, layer)
    )
    assert ag.duration_s == pytest.approx(want, rel=1e-12)
    # dp 1, cp 2 still reduces (over the 2 cp ranks); dp 2 alone over 2 ranks: factor 1/2
    (cp_only,) = build_pipeline_work(RING, _plan(cp=2, zero_stage=1), prof).ranks[0].grad_sync
    assert cp_only.duration_s == pytest.approx(10 * US + 0.5 * grad_bytes / 100e9, rel=1e-12)


def test_overlapped_buckets_span_dp_times_cp() -> None:
    prof = round_profile()
    plan = _plan(cp=2, zero_stage=0, overlap_grad_reduce=True)  # dp 1: still 2 ranks reduce
    work = build_pipeline_work(RING, plan, prof)
    buckets = work.stages[0].grad_buckets
    assert len(buckets) == 1
    grad_bytes = rank_parameters(RING, plan, rank=0) * 4
    assert buckets[0].segment.duration_s == pytest.approx(10 * US + grad_bytes / 100e9)


# --- planner -----------------------------------------------------------------------------


def _space(**kw: object) -> SearchSpace:
    base: dict[str, object] = {
        "zero_stages": (0,),
        "recomputes": (Recompute.NONE,),
        "sequence_parallel": (False,),
        "micro_batch_size": (1,),
        "overlap_grad_reduce": (False,),
        "vpps": (1,),
    }
    base.update(kw)
    return SearchSpace(**base)


def test_planner_enumerates_cp_only_when_asked() -> None:
    default = list(enumerate_plans(num_gpus=8, global_batch_size=8, space=_space()))
    assert {p.cp for p in default} == {1}
    asked = list(enumerate_plans(num_gpus=8, global_batch_size=8, space=_space(cp=(1, 2, 4))))
    layouts = {(p.tp, p.cp, p.pp, p.dp) for p in asked}
    expected = {
        (t, c, p, 8 // (t * c * p))
        for t, c, p in itertools.product((1, 2, 4, 8), (1, 2, 4), (1, 2, 4, 8))
        if 8 % (t * c * p) == 0
    }
    assert layouts == expected and all(p.num_gpus == 8 for p in asked)
    every = list(enumerate_plans(num_gpus=8, global_batch_size=8, space=_space(cp=None)))
    assert {p.cp for p in every} == {1, 2, 4, 8}
    unfused = _space(cp=(1, 2), execution=ExecutionSpec(attention=AttentionKernel.UNFUSED))
    assert {p.cp for p in enumerate_plans(num_gpus=8, global_batch_size=8, space=unfused)} == {1}


def test_planner_offers_zero_with_cp_even_at_dp_1() -> None:
    space = _space(cp=(2,), tp=(1,), pp=(1,), zero_stages=(0, 1))
    plans = list(enumerate_plans(num_gpus=2, global_batch_size=2, space=space))
    assert {(p.dp, p.cp, p.zero_stage) for p in plans} == {(1, 2, 0), (1, 2, 1)}


# --- a Llama 3 405B long-context check ---------------------------------------------------


@pytest.mark.parametrize(("layers", "pp", "gpus"), [(126, 14, 14336), (128, 16, 16384)])
def test_llama3_405b_16k_fits_with_cp2_not_cp1(layers: int, pp: int, gpus: int) -> None:
    # Llama 3 405B at 16k tokens, tp 8, Megatron distributed optimizer (ZeRO-1), full
    # recompute without SP, 1F1B. The real model's 126 layers split over pp 14; Llama 3's
    # pp 16 (uneven first/last stages) is checked on a 128-layer variant. cp 1: stage 0
    # stores the equivalent of all L layer inputs, 2*s*b*h = 512 MiB each (~63 GiB), over the
    # 80 GiB H100; cp 2 halves them and fits. dp * cp, the ZeRO shard, is the same for both.
    h100 = load_profile("h100-sxm5-80gb")
    model = resolve_model("llama3-405b", seq_length=16384)
    model = ModelSpec(**{**_fields(model), "num_layers": layers})
    plans = {
        cp: plan_from_fields(
            dp=gpus // (8 * pp * cp),
            tp=8,
            pp=pp,
            cp=cp,
            micro_batch_size=1,
            global_batch_size=2048,
            zero_stage=1,
            recompute=Recompute.FULL,
        )
        for cp in (1, 2)
    }
    one, two = check_plan(model, plans[1], h100), check_plan(model, plans[2], h100)
    assert one is not None and one.category == "out of memory"
    assert two is None
    mem1, mem2 = (rank_memory(model, plans[cp], h100, rank=0) for cp in (1, 2))
    assert mem1.total_bytes > h100.hbm_capacity_bytes > mem2.total_bytes
    assert mem2.activations_bytes == pytest.approx(mem1.activations_bytes / 2, rel=1e-12)
    assert mem2.optimizer_bytes == mem1.optimizer_bytes  # dp * cp = 128 both ways


# --- backtest ----------------------------------------------------------------------------

ROW = {
    "row_id": "C1",
    "model_name": "tiny",
    "num_layers": "24",
    "hidden_size": "2304",
    "num_attention_heads": "24",
    "seq_len_tokens": "16384",
    "vocab_size": "51200",
    "gpu_type": "a100-sxm4-80gb",
    "num_gpus": "8",
    "tp": "1",
    "pp": "1",
    "micro_batch_size_seqs": "1",
    "global_batch_size_seqs": "8",
    "recompute": "full",
    "zero_stage": "1",
    "sequence_parallel": "no",
    "precision": "bf16",
    "step_time_s": "2.0",
    "framework": "Megatron-LM (2024)",
}


def _predict(**cells: str) -> Prediction:
    return predict_row(RunRow(path="runs.csv", line=2, cells={**ROW, **cells}))


def test_backtest_models_a_stated_cp() -> None:
    stated = _predict(cp="2", framework="Megatron-LM (2021)")  # cp > 1 implies flash attention
    assert stated.status == "ok", stated.note
    assert "cp 2 (flash attention" in stated.note and "cp2" in stated.plan_label
    assert "unfused-attn" not in stated.plan_label


def test_backtest_searches_a_blank_cp_only_for_long_sequences() -> None:
    long = _predict()
    assert long.status == "ok", long.note
    assert "cp searched (1, 2, 4, 8; seq_len 16384 >= 16384)" in long.note
    short = _predict(seq_len_tokens="2048")
    assert "cp blank: 1 (seq_len 2048 < 16384)" in short.note and "cp" not in short.plan_label
    old = _predict(framework="Megatron-LM (2021)")  # unfused attention: no cp
    assert "cp blank: 1 (context parallelism needs flash attention)" in old.note


def test_backtest_search_picks_cp_when_only_cp_fits() -> None:
    # dp fixed to 1 on 8 GPUs with tp 1, pp 1: only cp 8 fills the GPUs.
    row = _predict(dp="1")
    assert row.status == "ok", row.note
    assert "cp8" in row.plan_label
