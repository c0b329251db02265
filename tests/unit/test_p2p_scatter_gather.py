"""Pipeline tensors with and without Megatron's scatter/gather, priced by hand.

Round-number profile (tests/unit/synthetic.py): NIC 10 GB/s + 5 us, NVLink collectives
100 GB/s busbw + 10 us. megatron-1.7b: s = 2048, h = 2304, 16-bit activations, so one
micro-batch's pipeline tensor is 2 * 2048 * 2304 = 9,437,184 bytes.
"""

from __future__ import annotations

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.specs.plan import plan_from_fields
from tests.unit.synthetic import round_profile

MODEL = resolve_model("megatron-1.7b")
TENSOR_BYTES = 9_437_184.0


def _send(**plan_kw: object):  # type: ignore[no-untyped-def]
    # 4 GPUs per node: the tp pair shares a node, each pipeline hop crosses nodes.
    plan = plan_from_fields(dp=2, tp=2, pp=2, micro_batch_size=1, global_batch_size=8, **plan_kw)
    return build_pipeline_work(MODEL, plan, round_profile(gpus_per_node=4)).stages[0].send_forward


def test_scatter_gather_sends_a_slice_and_gathers_it_on_nvlink() -> None:
    send = _send()
    assert send.num_bytes == TENSOR_BYTES / 2
    link_s = 5e-6 + (TENSOR_BYTES / 2) / 10e9  # 476.86 us on the NIC
    gather_s = 10e-6 + 0.5 * TENSOR_BYTES / 100e9  # all-gather, bus factor 1/2: 57.19 us
    assert send.duration_s == pytest.approx(link_s + gather_s)
    assert send.duration_s == pytest.approx(534.04512e-6)
    assert send.latency_s == pytest.approx(5e-6 + gather_s)


def test_without_scatter_gather_every_tp_rank_sends_the_whole_tensor() -> None:
    send = _send(scatter_gather_p2p=False)
    assert send.num_bytes == TENSOR_BYTES
    assert send.duration_s == pytest.approx(5e-6 + TENSOR_BYTES / 10e9)  # 948.72 us
    assert send.latency_s == pytest.approx(5e-6)


def test_sequence_parallel_tensors_are_already_split() -> None:
    for sg in (True, False):
        send = _send(sequence_parallel=True, scatter_gather_p2p=sg)
        assert send.num_bytes == TENSOR_BYTES / 2
        assert send.duration_s == pytest.approx(5e-6 + (TENSOR_BYTES / 2) / 10e9)


def test_full_p2p_shows_in_the_label_only_where_it_matters() -> None:
    base = dict(dp=2, tp=2, pp=2, micro_batch_size=1, global_batch_size=8)
    assert "full-p2p" in plan_from_fields(**base, scatter_gather_p2p=False).label()
    assert "full-p2p" not in plan_from_fields(**base).label()
    sp = plan_from_fields(**base, scatter_gather_p2p=False, sequence_parallel=True)
    assert "full-p2p" not in sp.label()


def test_scatter_gather_flag_must_be_bool() -> None:
    with pytest.raises(SpecError, match=r"plan\.scatter_gather_p2p"):
        plan_from_fields(
            dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1, scatter_gather_p2p="yes"
        )  # type: ignore[arg-type]
