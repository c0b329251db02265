"""TP communication of one transformer layer per pass: the collectives, and what Megatron-LM's
``--tp-comm-overlap`` leaves exposed (pure).

Without overlap (``tp_pass_times``): the collectives of one layer sit on the critical path,
per pass 2 all-reduces of the b x s x h activations, or with sequence parallelism 2
all-gathers + 2 reduce-scatters and in backward 2 more all-gathers (the inputs of the
column-parallel linears, re-gathered for their weight gradients: Korthikanti et al. 2022
§4.2.2; Megatron-LM ``LinearWithGradAccumulationAndAsyncCommunication`` issues it beside the
input-gradient GEMM, but it shares the GPU with it, so it is counted whole).

The all-gathers feed the QKV and first-MLP GEMMs, the reduce-scatters drain the projection
and second-MLP GEMMs. Megatron-LM's ``--tp-comm-overlap`` (Transformer
Engine userbuffers; NVIDIA NeMo / Megatron Bridge docs, "Communication Overlap: tensor
parallel"; the decomposition of Wang et al., ASPLOS 2023, "Overlap Communication with
Dependent Computation via Decomposition in Large Deep Learning Models") hides them two ways:

* **pipelined** (a collective and the GEMM that consumes or produces it): both are split
  into tp chunks; chunk k's transfer runs beside chunk k-1's GEMM, so one chunk's transfer
  is exposed and each of the other tp - 1 adds only what its GEMM chunk does not cover. The
  GEMM runs as tp GEMMs of m / tp rows, priced on the profile's curve like any GEMM (smaller
  GEMMs run less efficiently), and what they take beyond the whole GEMM is charged here:

      exposed = c/t + (t - 1) * excess(c/t, g'/t) + (g' - g)      (g' = tp chunk GEMMs)

  Forward: all-gather -> QKV, projection -> reduce-scatter, all-gather -> first MLP GEMM,
  second MLP GEMM -> reduce-scatter. Backward: the output-gradient all-gathers of the
  projection and second MLP GEMM, pipelined with their input-gradient GEMMs.
* **bulk** (a collective beside an independent GEMM, backward of the column-parallel
  linears): the input re-gather beside the input-gradient GEMM, and the input-gradient
  reduce-scatter beside the weight-gradient GEMM: exposed = excess(c, g).

``excess`` is ``zero3.overlapped_excess_s``: max(0, c - g, c s / (1 + s)), with s the
profile's ``overlap_compute_slowdown_fraction`` (compute slows while communication shares
the GPU; Lee et al. 2025).

Limit, known (``docs/methods/backtest.md``, "Tensor-parallel communication"): with
the overlap on, two sources come out about 10% fast. NVIDIA's performance recipes run most
tp > 1 layouts of the NeMo / Megatron-Bridge tables with TP overlap; offered it, those rows
move 3-15 points faster (mean signed -4.0% -> -10.7%), and GPT-3 175B on 96 H100s
(Megatron-LM README, flag on, 47% MFU) comes out at 62% with tp 8. Either the exposed
collectives above are priced too high or the overlap hides too much of them; a layer measured
with and without ``--tp-comm-overlap`` on a GPU would say which.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.comm import Collective, collective_time_s
from plansim.analytic.ranks import LayoutGroups
from plansim.analytic.zero3 import exposed_gather_s, overlapped_excess_s
from plansim.errors import require_positive_int
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan


def hidden_message_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes of one micro-batch's b x (s/cp) x h activations on one rank, in the plan's
    activation width: the message of the TP collectives and of a pipeline send."""
    act = float(plan.precision.activation_bytes)
    return act * model.seq_length / plan.cp * plan.micro_batch_size * model.hidden_size


def tp_pass_times(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    *,
    gemm_s: dict[str, float],
    chunked_gemm_s: dict[str, float],
) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's TP collectives on the critical path.

    ``gemm_s``: forward seconds of the layer's GEMMs by ``flops.layer_gemms`` name (``qkv``,
    ``attn_out``, ``mlp_up``, [``mlp_gate``], ``mlp_down``); ``chunked_gemm_s``: the same
    GEMMs as tp pieces of m / tp rows. Both used with overlap only.
    """
    if plan.tp == 1:
        return 0.0, 0.0
    message = hidden_message_bytes(model, plan)

    def time_s(collective: Collective) -> float:
        return collective_time_s(
            profile, collective=collective, message_bytes=message, span=groups.tp
        )

    if not plan.sequence_parallel:
        return 2.0 * time_s(Collective.ALL_REDUCE), 2.0 * time_s(Collective.ALL_REDUCE)
    ag, rs = time_s(Collective.ALL_GATHER), time_s(Collective.REDUCE_SCATTER)
    if not plan.tp_comm_overlap:
        return 2.0 * (ag + rs), 2.0 * (ag + rs) + 2.0 * ag
    return overlapped_tp_s(
        all_gather_s=ag,
        reduce_scatter_s=rs,
        gemms=_linears(gemm_s),
        chunked=_linears(chunked_gemm_s),
        tp=plan.tp,
        slowdown=profile.overlap_compute_slowdown_fraction,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearGemms:
    """Seconds of one layer's four TP linears' forward GEMMs on one rank (an input-gradient
    GEMM takes as long as its forward; a weight-gradient GEMM too).

    Attributes:
        qkv: fused QKV projection (column-parallel).
        proj: attention output projection (row-parallel).
        fc1: first MLP GEMM, gate and up together for SwiGLU (column-parallel).
        fc2: second MLP GEMM (row-parallel).
    """

    qkv: float
    proj: float
    fc1: float
    fc2: float


#: Column-parallel GEMMs that take the attention's input all-gather: the fused QKV, or MLA's
#: up-projections and its query projection without a latent (``plansim.analytic.moe_layer``).
_QKV_GEMMS = ("qkv", "q", "q_up", "kv_up")


def _linears(by_name: dict[str, float]) -> LinearGemms:
    """The TP-sharded linears by role; a MoE layer without shared experts has no ``mlp_*``
    GEMMs (its experts are split over etp, not tp: ``plansim.analytic.moe_layer``)."""
    return LinearGemms(
        qkv=sum(by_name.get(name, 0.0) for name in _QKV_GEMMS),
        proj=by_name["attn_out"],
        fc1=by_name.get("mlp_up", 0.0) + by_name.get("mlp_gate", 0.0),
        fc2=by_name.get("mlp_down", 0.0),
    )


def pipelined_s(
    comm_s: float, gemm_s: float, *, chunked_gemm_s: float, chunks: int, slowdown: float
) -> float:
    """Exposed seconds of ``comm_s`` split into ``chunks`` pieces pipelined with the
    ``chunks`` GEMM pieces that take ``chunked_gemm_s`` together (module docstring): one
    piece's transfer, each further one's excess, and the pieces' time beyond ``gemm_s``.

    Raises:
        SpecError: chunks < 1.
    """
    require_positive_int("chunks", chunks)
    hidden_behind = exposed_gather_s(
        chunks, gather_s=comm_s / chunks, compute_s=chunked_gemm_s / chunks, slowdown=slowdown
    )
    return hidden_behind + max(0.0, chunked_gemm_s - gemm_s)


def overlapped_tp_s(
    *,
    all_gather_s: float,
    reduce_scatter_s: float,
    gemms: LinearGemms,
    chunked: LinearGemms,
    tp: int,
    slowdown: float,
) -> tuple[float, float]:
    """(forward, backward) exposed TP seconds of one layer with TP communication overlap.

    ``all_gather_s`` / ``reduce_scatter_s``: one sequence-parallel collective of the layer's
    b x s x h activations over the TP group (:func:`hidden_message_bytes`); ``chunked``: the
    same GEMMs run as tp pieces of m / tp rows (input-gradient GEMMs split alike).
    """

    def pipe(comm: float, name: str) -> float:
        whole, pieces = getattr(gemms, name), getattr(chunked, name)
        return pipelined_s(comm, whole, chunked_gemm_s=pieces, chunks=tp, slowdown=slowdown)

    ag, rs = all_gather_s, reduce_scatter_s
    forward = pipe(ag, "qkv") + pipe(rs, "proj") + pipe(ag, "fc1") + pipe(rs, "fc2")
    backward = pipe(ag, "proj") + pipe(ag, "fc2")
    for gemm in (gemms.qkv, gemms.fc1):  # column-parallel: bulk overlap
        backward += overlapped_excess_s(ag, gemm, slowdown)  # input re-gather | dgrad
        backward += overlapped_excess_s(rs, gemm, slowdown)  # dgrad reduce-scatter | wgrad
    return forward, backward
