"""ZeRO-Offload / ZeRO-Infinity: memory against DeepSpeed's estimators, the offload traffic
on the timeline, PCIe sharing, host memory, errors, bounds and determinism.

Round numbers (``round_profile``: PCIe 25 GB/s) plus a host of 1e9 Adam parameters/s and
NVMe 10 GB/s read / 5 GB/s write per node, so every expected time is worked out by hand.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.memory import (
    model_state_bytes,
    rank_memory,
    rank_parameters,
    state_bytes_per_param,
    transient_bytes,
)
from plansim.analytic.offload import host_bytes_per_node, host_step_segments, offload_choices
from plansim.analytic.offload_microbatch import stage_parameters
from plansim.analytic.params import count_parameters
from plansim.calibrate.build import build_update
from plansim.calibrate.raw import read_raw
from plansim.calibrate.run_info import RunInfo
from plansim.catalog import resolve_model
from plansim.errors import InputFileError, SpecError
from plansim.io.profiles import load_profile, profile_from_dict, profile_to_dict, profiles_dir
from plansim.planner.bounds import step_time_lower_bound_s
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.planner.evaluate import Evaluation, Rejected, check_plan, evaluate
from plansim.schedule import build_actions
from plansim.sim import simulate
from plansim.specs.hardware import HardwareProfile, HostSpec
from plansim.specs.plan import (
    OffloadDevice,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    plan_from_fields,
)
from plansim.specs.work import P2P, PipelineWork, RankWork, StageWork
from tests.unit.synthetic import round_profile

NONE, CPU, NVME = OffloadDevice.NONE, OffloadDevice.CPU, OffloadDevice.NVME
PCIE_BYTES_PER_S = 25e9  # round_profile's
ADAM_PARAMS_PER_S = 1e9
NVME_READ, NVME_WRITE = 10e9, 5e9
MODEL = resolve_model("megatron-1.7b")
PSI = count_parameters(MODEL).total


def host_profile(*, gpus_per_node: int = 8, memory_bytes: float = 2.0**40) -> HardwareProfile:
    return replace(
        round_profile(gpus_per_node=gpus_per_node),
        host=HostSpec(
            memory_bytes=memory_bytes,
            adam_params_per_s=ADAM_PARAMS_PER_S,
            nvme_read_bytes_per_s=NVME_READ,
            nvme_write_bytes_per_s=NVME_WRITE,
        ),
    )


def plan(**kw: object) -> ParallelPlan:
    fields: dict[str, object] = dict(
        dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8, recompute=Recompute.FULL
    )
    fields.update(kw)
    return plan_from_fields(**fields)  # type: ignore[arg-type]


# --- memory: DeepSpeed's estimators (reference memory.md §4) --------------------------------


def gpu_states(p: ParallelPlan) -> float:
    m = rank_memory(MODEL, p, host_profile(), rank=0)
    return m.weights_bytes + m.gradients_bytes + m.optimizer_bytes


def test_one_stage_one_tp_rank_holds_every_parameter() -> None:
    assert rank_parameters(MODEL, plan(), rank=0) == PSI


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP16])
def test_gpu_model_states_match_deepspeed_estimators(precision: Precision) -> None:
    n = 8  # total GPUs = dp (tp = pp = 1)
    # estimate_zero2_model_states_mem_needs, optimizer offloaded: GPU = 2 Psi
    assert gpu_states(plan(zero_stage=2, offload_optimizer=CPU, precision=precision)) == 2 * PSI
    # estimate_zero3: optimizer offloaded: 4 Psi_L + 2 Psi / N; and params too: 4 Psi_L
    # (the 4 Psi_L working set, two gathered layers, sits in transient_bytes)
    z3 = plan(zero_stage=3, offload_optimizer=CPU, precision=precision)
    assert gpu_states(z3) == pytest.approx(2 * PSI / n)
    assert gpu_states(z3.with_fields(offload_param=CPU)) == 0.0
    counts = count_parameters(MODEL)
    psi_layer = counts.attention_per_layer + counts.mlp_per_layer
    working = transient_bytes(MODEL, z3, rank=0) - transient_bytes(
        MODEL, plan(zero_stage=1), rank=0
    )
    assert working == pytest.approx(4 * psi_layer)
    # stage 1 keeps the unsharded 16-bit gradients (stage 1 does not partition gradients)
    assert gpu_states(plan(zero_stage=1, offload_optimizer=CPU, precision=precision)) == 4 * PSI


def test_without_offload_the_states_are_unchanged() -> None:
    per = state_bytes_per_param(Precision.BF16)  # 2 + 4 + 12 (Megatron bf16)
    states = model_state_bytes(PSI, dp=8, zero_stage=2, per_param=per)
    assert (states.weights_bytes, states.gradients_bytes, states.optimizer_bytes) == (
        2 * PSI,
        4 * PSI / 8,
        12 * PSI / 8,
    )


def test_host_bytes_match_deepspeed_estimators() -> None:
    # zero3 (zero_init): CPU = 16 Psi / nodes (optimizer) and 18 Psi / nodes (+ params),
    # without the estimators' 1.5 buffer factor; 16 GPUs on 2 nodes of 8
    prof = host_profile(gpus_per_node=8)
    z3 = plan(dp=16, global_batch_size=16, zero_stage=3, offload_optimizer=CPU)
    assert host_bytes_per_node(MODEL, z3, prof)[1] == pytest.approx(16 * PSI / 2)
    both = z3.with_fields(offload_param=CPU)
    assert host_bytes_per_node(MODEL, both, prof)[1] == pytest.approx(18 * PSI / 2)
    # zero2 on one node of 4 GPUs: Psi * max(4 * 4, 16) = 16 Psi
    z2 = plan(dp=4, global_batch_size=4, zero_stage=2, offload_optimizer=CPU)
    assert host_bytes_per_node(MODEL, z2, host_profile(gpus_per_node=4))[1] == pytest.approx(
        16 * PSI
    )
    # NVMe keeps fp32 master, m, v (12 B): the host only the fp32 gradients (4 B)
    nvme = z3.with_fields(offload_optimizer=NVME)
    assert host_bytes_per_node(MODEL, nvme, prof)[1] == pytest.approx(4 * PSI / 2)


def test_host_memory_too_small_is_a_rejection_with_numbers() -> None:
    p = plan(zero_stage=2, offload_optimizer=CPU)
    need_gib = 16 * PSI / 2**30  # 8 GPUs x 16 B x Psi / 8 on one node
    small = host_profile(memory_bytes=10 * 2**30)
    outcome = check_plan(MODEL, p, small)
    assert isinstance(outcome, Rejected)
    assert outcome.category == "host out of memory"
    assert outcome.reason.startswith(f"host needs {need_gib:.1f} GiB per node, has 10.0 GiB")
    assert check_plan(MODEL, p, host_profile()) is None


# --- costing and the timeline ---------------------------------------------------------------


def test_offloaded_step_is_on_the_timeline_with_its_kinds_and_pcie() -> None:
    prof = host_profile()
    p = plan(dp=2, global_batch_size=2, zero_stage=2, offload_optimizer=CPU)
    work = build_pipeline_work(MODEL, p, prof)
    local = PSI / 2
    grad_s = 4 * local / PCIE_BYTES_PER_S  # the fp32 gradient shard, one PCIe direction
    copy_s = 2 * local / PCIE_BYTES_PER_S  # the 16-bit parameter shard back
    adam_s = local / ADAM_PARAMS_PER_S
    opt = work.ranks[0].optimizer
    assert [s.kind for s in opt] == ["offload_d2h", "cpu_adam", "offload_h2d", "dp_comm"]
    assert [s.link for s in opt[:3]] == ["pcie", "", "pcie"]
    assert {s.stream for s in opt[:3]} == {"dp"}
    assert [s.duration_s for s in opt[:3]] == pytest.approx([grad_s, adam_s, copy_s])
    assert (opt[0].num_bytes, opt[2].num_bytes) == (4 * local, 2 * local)

    actions = build_actions(p.schedule, num_ranks=1, num_microbatches=p.num_microbatches)
    timeline = simulate(actions, work).timeline
    rows = timeline[timeline["kind"].isin(["offload_d2h", "cpu_adam", "offload_h2d"])]
    assert list(rows["kind"]) == ["offload_d2h", "cpu_adam", "offload_h2d"]
    assert list(rows["stream"]) == ["dp"] * 3
    spans = list(rows["end_s"] - rows["start_s"])
    assert spans == pytest.approx([grad_s, adam_s, copy_s])
    grad_sync_end = timeline[timeline["kind"] == "dp_comm"]["end_s"].min()
    assert rows["start_s"].iloc[0] == pytest.approx(grad_sync_end)  # after the reduce-scatter
    assert rows["start_s"].iloc[1] == pytest.approx(rows["end_s"].iloc[0])

    # vs no offload: the GPU's fused Adam is replaced by the three host segments
    ev_off = evaluate(MODEL, p, prof)
    ev_gpu = evaluate(MODEL, p.with_fields(offload_optimizer=NONE), prof)
    assert isinstance(ev_off, Evaluation) and isinstance(ev_gpu, Evaluation)
    gpu_adam_s = ev_gpu.result.busy_s_by_kind["optimizer"]
    assert ev_off.step_time_s - ev_gpu.step_time_s == pytest.approx(
        grad_s + copy_s + adam_s - gpu_adam_s
    )
    for kind, seconds in (("offload_d2h", grad_s), ("cpu_adam", adam_s)):
        assert ev_off.exposed_comm_s_by_kind[kind] == pytest.approx(seconds)
    assert "optimizer" not in ev_off.result.busy_s_by_kind


def test_nvme_step_reads_and_writes_the_states_at_the_gpu_share_of_the_node() -> None:
    prof = host_profile(gpus_per_node=8)
    p = plan(zero_stage=3, offload_optimizer=NVME, offload_param=NVME)
    work = build_pipeline_work(MODEL, p, prof)
    local = PSI / 8
    opt = work.ranks[0].optimizer
    assert [s.kind for s in opt] == ["offload_d2h", "nvme_read", "cpu_adam", "nvme_write"]
    # 8 GPUs share the node's NVMe: 12 B/param read at 10/8 GB/s; write 12 + 2 (params)
    assert opt[1].duration_s == pytest.approx(12 * local / (NVME_READ / 8))
    assert opt[3].duration_s == pytest.approx(14 * local / (NVME_WRITE / 8))
    # every forward / backward first fetches the stage's 16-bit shard: NVMe, then PCIe
    shard = 2 * stage_parameters(MODEL, p, stage=0) / 8
    fwd = work.stages[0].forward
    assert [s.kind for s in fwd[:2]] == ["nvme_read", "offload_h2d"]
    assert fwd[1].duration_s == pytest.approx(shard / PCIE_BYTES_PER_S)
    assert fwd[1].link == "pcie"
    assert [s.kind for s in work.stages[0].backward[:2]] == ["nvme_read", "offload_h2d"]


def test_param_offload_alone_keeps_gpu_adam_and_copies_the_shard_back() -> None:
    p = plan(zero_stage=3, offload_param=CPU)
    opt = build_pipeline_work(MODEL, p, host_profile()).ranks[0].optimizer
    assert [s.kind for s in opt] == ["optimizer", "offload_d2h"]
    assert opt[1].num_bytes == pytest.approx(2 * PSI / 8)


def _two_rank_work(*, nodes: tuple[int, int]) -> PipelineWork:
    """Two pipeline ranks with free compute whose steps start together at t = 0."""
    p = plan(zero_stage=2, offload_optimizer=CPU)
    step = host_step_segments(p, host_profile(), local_params=1e9)  # 4 GB: 160 ms, 2 GB: 80
    free = P2P(duration_s=0.0, num_bytes=0.0)
    stage = StageWork(
        forward=(),
        backward=(),
        backward_input=(),
        backward_weight=(),
        send_forward=free,
        send_backward=free,
        activation_bytes=0.0,
    )
    rank = RankWork(static_bytes=0.0, grad_sync=(), optimizer=step)
    return PipelineWork(
        stages=(stage, stage), ranks=(rank, rank), num_microbatches=1, rank_nodes=nodes
    )


@pytest.mark.parametrize(("nodes", "factor"), [((0, 0), 2.0), ((0, 1), 1.0)])
def test_two_concurrent_pcie_copies_on_one_node_share_it(
    nodes: tuple[int, int], factor: float
) -> None:
    grad_s, copy_s, adam_s = 4e9 / PCIE_BYTES_PER_S, 2e9 / PCIE_BYTES_PER_S, 1.0
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=2, num_microbatches=1)
    timeline = simulate(actions, _two_rank_work(nodes=nodes)).timeline
    for rank in (0, 1):
        mine = timeline[timeline["rank"] == rank]
        starts = dict(zip(mine["kind"], mine["start_s"], strict=True))
        spans = dict(zip(mine["kind"], mine["end_s"] - mine["start_s"], strict=True))
        assert starts["offload_d2h"] == 0.0
        assert spans["offload_d2h"] == pytest.approx(factor * grad_s)
        assert spans["cpu_adam"] == pytest.approx(adam_s)  # not a transfer: never stretched
        assert spans["offload_h2d"] == pytest.approx(factor * copy_s)


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(zero_stage=0, offload_optimizer=CPU),
            "plan.offload_optimizer=cpu needs zero_stage 1, 2 or 3 (got zero_stage=0); with "
            "zero_stage 0 choose offload_optimizer from: none",
        ),
        (
            dict(zero_stage=2, offload_optimizer=NVME),
            "plan.offload_optimizer=nvme needs zero_stage 3 (got zero_stage=2); with "
            "zero_stage 2 choose offload_optimizer from: none, cpu",
        ),
        (
            dict(zero_stage=1, offload_param=CPU),
            "plan.offload_param=cpu needs zero_stage 3 (got zero_stage=1); with zero_stage 1 "
            "choose offload_param from: none",
        ),
        (dict(zero_stage=3, offload_param="cpu"), "plan.offload_param='cpu' is not allowed"),
    ],
)
def test_bad_offload_combinations_name_the_field_and_the_choices(
    kw: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        plan(**kw)


def test_offload_without_a_host_section_is_one_clear_error() -> None:
    p = plan(zero_stage=2, offload_optimizer=CPU)
    expected = (
        "offload_optimizer=cpu needs a host section in profile round-numbers (host Adam rate, "
        "host memory); see hardware_profiles/README.md"
    )
    with pytest.raises(SpecError) as err:
        evaluate(MODEL, p, round_profile())
    assert str(err.value) == expected
    with pytest.raises(SpecError, match="needs a host section"):
        build_pipeline_work(MODEL, p, round_profile())
    no_nvme = replace(host_profile(), host=HostSpec(memory_bytes=1e12, adam_params_per_s=1e9))
    with pytest.raises(SpecError, match=r"needs host.nvme_read_gb_per_s"):
        evaluate(MODEL, plan(zero_stage=3, offload_optimizer=NVME), no_nvme)


def test_profile_host_section_reads_writes_and_checks() -> None:
    profile = load_profile("cpu-2core-gloo")
    assert profile.host is not None
    assert profile.host.adam_params_per_s == pytest.approx(138869271.452)
    assert profile.host.memory_bytes == pytest.approx(23.5405845642 * 2**30)
    data = profile_to_dict(profile)
    assert profile_from_dict(data, source="x").host == profile.host
    for name in ("a100-sxm4-80gb", "h100-sxm5-80gb"):
        assert load_profile(name).host is None  # no host figures in the reference data
    prov = {k: v for k, v in data["provenance"].items() if k != "host.adam_params_per_s"}
    bad = {**data, "host": {"memory_gib": 8}, "provenance": prov}
    with pytest.raises(InputFileError, match=r"host.adam_params_per_s: missing required key"):
        profile_from_dict(bad, source="x")
    bad = {**data, "host": {**data["host"], "nvme_read_gb_per_s": 3}}
    bad["provenance"] = {**data["provenance"], "host.nvme_read_gb_per_s": "assumption: test"}
    with pytest.raises(InputFileError, match="go together"):
        profile_from_dict(bad, source="x")
    bad = {**data, "provenance": dict(data["provenance"])}
    del bad["provenance"]["host.memory_gib"]
    with pytest.raises(InputFileError, match=r"no source given for: host.memory_gib"):
        profile_from_dict(bad, source="x")


def test_calibration_writes_the_host_section_from_the_committed_raw_rows() -> None:
    rows = read_raw(profiles_dir() / "cpu-2core-gloo.raw.csv")
    info = RunInfo(
        run_id="20261122T124837.456Z",
        date="2026-11-22",
        backend="gloo",
        device="cpu",
        nproc=2,
        quick=False,
        raw_file="cpu-2core-gloo.raw.csv",
        env={"torch": "2.13.0+cpu", "device_name": "Test CPU", "cpu_count": "2"},
        host_memory_total_bytes=24684096 * 1024,
    )
    update = build_update(rows, info, base=None, name="x").update
    # the largest step, 8388608 parameters: rank medians 60.38 and 60.44 ms (raw rows)
    median_s = (0.0603775795025 + 0.0604354399984) / 2
    assert update.host["adam_params_per_s"] == pytest.approx(8388608 / median_s, rel=1e-12)
    assert update.host["memory_bytes"] == 24684096 * 1024
    assert {"host.adam_params_per_s", "host.memory_gib"} <= set(update.provenance)


# --- planner, bound, determinism -------------------------------------------------------------


def test_planner_tries_offload_only_with_a_host_section_and_allowed_stages() -> None:
    assert offload_choices(round_profile()) == ((NONE, NONE),)
    space = SearchSpace(
        tp=(1,), pp=(1,), micro_batch_size=(1,), offloads=offload_choices(host_profile())
    )
    plans = list(enumerate_plans(num_gpus=8, global_batch_size=8, space=space))
    pairs = {(p.zero_stage, p.offload_optimizer, p.offload_param) for p in plans}
    assert pairs >= {(1, CPU, NONE), (2, CPU, NONE), (3, CPU, CPU), (3, NVME, NVME)}
    assert not any(
        (z < 3 and (o is NVME or q is not NONE)) or (z == 0 and o is not NONE) for z, o, q in pairs
    )
    default = list(
        enumerate_plans(
            num_gpus=8, global_batch_size=8, space=replace(space, offloads=((NONE, NONE),))
        )
    )
    assert all(p.offload_optimizer is NONE and p.offload_param is NONE for p in default)
    # one data-parallel rank: ZeRO-Offload on a single GPU is still tried
    single = list(enumerate_plans(num_gpus=1, global_batch_size=8, space=space))
    assert {(p.zero_stage, p.offload_optimizer) for p in single} >= {(0, NONE), (2, CPU)}


OFFLOAD_PLANS = [
    plan(zero_stage=1, offload_optimizer=CPU),
    plan(dp=2, pp=4, global_batch_size=16, zero_stage=2, offload_optimizer=CPU),
    plan(dp=2, pp=4, global_batch_size=16, zero_stage=3, offload_optimizer=CPU, offload_param=CPU),
    plan(
        dp=2,
        pp=2,
        vpp=2,
        global_batch_size=8,
        zero_stage=3,
        offload_optimizer=NVME,
        offload_param=NVME,
        schedule=Schedule.INTERLEAVED_1F1B,
    ),
    plan(dp=4, pp=2, global_batch_size=8, zero_stage=3, offload_param=CPU, schedule=Schedule.ZB_H1),
    plan(
        dp=1,
        pp=8,
        global_batch_size=8,
        zero_stage=2,
        offload_optimizer=CPU,
        schedule=Schedule.GPIPE,
    ),
]


@pytest.mark.parametrize("p", OFFLOAD_PLANS, ids=lambda p: p.label())
def test_lower_bound_stays_below_the_simulated_step(p: ParallelPlan) -> None:
    prof = host_profile(gpus_per_node=4)  # pipeline ranks share nodes: PCIe copies contend
    ev = evaluate(MODEL, p, prof)
    assert isinstance(ev, Evaluation), ev
    bound = step_time_lower_bound_s(
        build_pipeline_work(MODEL, p, prof, links=False), schedule=p.schedule
    )
    assert 0 < bound <= ev.step_time_s
    assert {"offload_d2h", "offload_h2d"} & set(ev.result.busy_s_by_kind)


def test_offload_simulation_is_deterministic() -> None:
    p = OFFLOAD_PLANS[2]
    prof = host_profile(gpus_per_node=4)
    first, second = evaluate(MODEL, p, prof), evaluate(MODEL, p, prof)
    assert isinstance(first, Evaluation) and isinstance(second, Evaluation)
    pd.testing.assert_frame_equal(first.result.timeline, second.result.timeline)
    assert first.step_time_s == second.step_time_s
    assert p.label().endswith("offload-opt-cpu offload-param-cpu")
