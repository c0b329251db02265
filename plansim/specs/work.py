"""The work one simulated pipeline replica has to do: the contract between costing and engine.

``plansim.analytic.cost`` turns (ModelSpec, ParallelPlan, HardwareProfile) into a
:class:`PipelineWork`; ``plansim.sim.engine`` executes it along per-rank action lists.
Everything here is already in seconds and bytes; the engine does no modelling of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from plansim.errors import SpecError
from plansim.specs.stage_placement import StageGraph, StagePlacement, rank_of_stage

#: Streams a rank has. Compute segments and blocking TP collectives run on "compute"/"tp"
#: one after another (TP collectives block the compute stream, as in Megatron);
#: "pp_send"/"pp_recv" and "dp" run concurrently with compute.
STREAMS = ("compute", "tp", "pp_send", "pp_recv", "dp")
#: Links a transfer can use on its rank (``plansim.sim.links``): the GPU's NVLink, its NIC,
#: its PCIe link (with the node's host memory behind it), or "" = no link modelled (the
#: transfer takes its duration whatever else runs).
LINKS = ("", "nvlink", "nic", "pcie")
#: Once-per-step ``grad_sync`` kinds that are ONE collective among the simulated pipeline
#: ranks carrying them (the tied-embedding gradient all-reduce between the first and last
#: stage): each side starts only when every side has reached it on its dp stream.
RENDEZVOUS_KINDS = ("embedding_grad_comm",)


def _check_transfer(what: str, *, duration_s: float, latency_s: float, link: str) -> None:
    """Shared checks of a timed transfer's duration, latency and link."""
    if not duration_s >= 0:
        raise SpecError(f"{what}: duration_s must be >= 0, got {duration_s}")
    if not 0 <= latency_s <= duration_s:
        raise SpecError(
            f"{what}: latency_s must be in [0, duration_s={duration_s}], got {latency_s}"
        )
    if link not in LINKS:
        raise SpecError(f"{what}: link={link!r}; choose one of: {', '.join(map(repr, LINKS))}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """One piece of an action, executed in order with the other segments of that action.

    Attributes:
        kind: what it is: ``forward``, ``backward``, ``backward_input``, ``backward_weight``,
            ``recompute``, ``tp_comm``, ``dp_comm``, ``optimizer``, ...
        stream: one of STREAMS; ``tp`` segments hold the compute stream too (blocking).
        duration_s: seconds when nothing else uses its link (the profile's figure).
        num_bytes: bytes moved (communication) or 0.
        link: the rank's link the transfer loads (one of LINKS; "" = none modelled). Only
            communication segments (any stream but ``compute``) may name one; concurrent
            transfers on one link share it (``plansim.sim.links``).
        latency_s: the part of duration_s that does not depend on bandwidth (alpha of the
            alpha-beta model); it is not stretched when the link is shared.

    Raises:
        SpecError: unknown stream or link, negative duration, latency outside
            [0, duration_s], or a link on the compute stream.
    """

    kind: str
    stream: str
    duration_s: float
    num_bytes: float = 0.0
    link: str = ""
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.stream not in STREAMS:
            raise SpecError(f"segment.stream={self.stream!r}; choose one of: {', '.join(STREAMS)}")
        what = f"segment {self.kind}"
        _check_transfer(what, duration_s=self.duration_s, latency_s=self.latency_s, link=self.link)
        if self.link and self.stream == "compute":
            raise SpecError(f"{what}: link={self.link!r} on the compute stream; kernels use none")


def lengthen_first(
    segments: tuple[Segment, ...], added_s: float, match: Callable[[Segment], bool]
) -> tuple[Segment, ...]:
    """``segments`` with ``added_s`` more on the first one ``match`` accepts (unchanged when
    none does)."""
    first = next((i for i, seg in enumerate(segments) if match(seg)), None)
    return segments if first is None else _lengthened(segments, first, added_s)


def lengthen_longest(
    segments: tuple[Segment, ...], added_s: float, match: Callable[[Segment], bool]
) -> tuple[Segment, ...]:
    """``segments`` with ``added_s`` more (or less, when negative) on the longest one ``match``
    accepts, the first of equals (unchanged when none does). For a change that belongs to a
    pass's bulk rather than to a short segment before it (a pipeline action's own work).

    Raises:
        SpecError: the longest segment would go below zero seconds.
    """
    picked = [i for i, seg in enumerate(segments) if match(seg)]
    if not picked:
        return segments
    longest = max(picked, key=lambda i: segments[i].duration_s)
    return _lengthened(segments, longest, added_s)


def _lengthened(segments: tuple[Segment, ...], index: int, added_s: float) -> tuple[Segment, ...]:
    seg = segments[index]
    longer = dataclasses.replace(seg, duration_s=seg.duration_s + added_s)
    return (*segments[:index], longer, *segments[index + 1 :])


@dataclass(frozen=True, slots=True, kw_only=True)
class P2P:
    """A point-to-point transfer between neighbouring pipeline stages, per micro-batch.

    Attributes:
        duration_s: seconds when nothing else uses its links (the profile's figure).
        num_bytes: bytes moved.
        link: tier it travels on (one of LINKS; "" = none modelled): it loads the sending
            half of the sender's link and the receiving half of the receiver's.
        latency_s: the part of duration_s not stretched when a link is shared.

    Raises:
        SpecError: negative duration, latency outside [0, duration_s], or unknown link.
    """

    duration_s: float
    num_bytes: float
    link: str = ""
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        _check_transfer("p2p", duration_s=self.duration_s, latency_s=self.latency_s, link=self.link)


@dataclass(frozen=True, slots=True, kw_only=True)
class GradBucket:
    """One bucket of a stage's DP gradient reduction (Megatron-LM DDP gradient buckets,
    ``--ddp-bucket-size``; PyTorch DDP, Li et al. VLDB 2020 §3.2).

    Attributes:
        segment: the collective (all-reduce, or ZeRO-1/2 reduce-scatter) on the ``dp`` stream.
        ready_fraction: in (0, 1]: the bucket's gradients are complete once this fraction of
            the stage's last backward action of the step (B, or W when split) has run; 1 = at
            its end. Costing's estimate, not the engine's (the engine only scales it).
        num_params: parameters whose gradients the bucket reduces (for reports).

    Raises:
        SpecError: segment not on the ``dp`` stream, or ready_fraction outside (0, 1].
    """

    segment: Segment
    ready_fraction: float = 1.0
    num_params: float = 0.0

    def __post_init__(self) -> None:
        if self.segment.stream != "dp":
            raise SpecError(f"grad bucket segment.stream={self.segment.stream!r}; must be 'dp'")
        if not 0.0 < self.ready_fraction <= 1.0:
            raise SpecError(
                f"grad bucket ready_fraction must be in (0, 1], got {self.ready_fraction}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class StageWork:
    """Per-micro-batch work of one pipeline stage (model chunk), TP folded in.

    Attributes:
        forward: segments of action F.
        backward: segments of action B (full backward: recompute + input-grad + weight-grad).
        backward_input: segments of action I (input-grad only, zero-bubble split).
        backward_weight: segments of action W (weight-grad only).
        send_forward: activation sent to the next stage after F (none on the last stage).
        send_backward: gradient sent to the previous stage after B/I (none on the first stage).
        activation_bytes: bytes stored from F until the matching B (or W) frees them.
        grad_buckets: the stage's once-per-step DP gradient reduction, one collective per
            bucket, in reverse layer order (the order backward produces them), so their
            ready_fraction never decreases. With ``PipelineWork.overlap_grad_reduce`` each
            bucket is queued on the rank's ``dp`` stream once ready; otherwise all of them
            after the rank's last action. Empty: nothing reduced per stage (dp == 1, ZeRO-3,
            or a costing that puts the whole reduction in ``RankWork.grad_sync``).
        num_layers: transformer layers of the stage: where a schedule overlaps a forward and
            a backward chunk (DualPipe), the engine interleaves the two layer by layer, each
            segment cut in this many equal slices (the repository overlaps per layer).

    Raises:
        SpecError: grad_buckets' ready fractions decrease, or num_layers < 1.
    """

    forward: tuple[Segment, ...]
    backward: tuple[Segment, ...]
    backward_input: tuple[Segment, ...]
    backward_weight: tuple[Segment, ...]
    send_forward: P2P
    send_backward: P2P
    activation_bytes: float
    grad_buckets: tuple[GradBucket, ...] = ()
    num_layers: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int):
            raise SpecError(f"stage num_layers must be an integer >= 1, got {self.num_layers!r}")
        if self.num_layers < 1:
            raise SpecError(f"stage num_layers must be >= 1, got {self.num_layers}")
        fractions = [bucket.ready_fraction for bucket in self.grad_buckets]
        if fractions != sorted(fractions):
            raise SpecError(
                f"stage grad_buckets must be ready in order (backward order); "
                f"ready_fraction = {fractions}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class RankWork:
    """Once-per-step work of one pipeline rank outside the micro-batch loop.

    Attributes:
        static_bytes: weights, gradients, optimizer states, buffers and reserve on this rank
            (the part of memory that does not depend on micro-batches in flight).
        grad_sync: gradient communication that is not per stage (e.g. the tied-embedding
            all-reduce between first and last stage), or the whole DP reduction when costing
            does not split it by stage; on the ``dp`` stream after the rank's last action,
            behind any stage buckets still queued there.
        optimizer: optimizer step (and ZeRO-1/2 parameter all-gather), after grad_sync and
            every stage bucket of the rank have ended.
    """

    static_bytes: float
    grad_sync: tuple[Segment, ...]
    optimizer: tuple[Segment, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineWork:
    """All the work of one representative pipeline replica for one optimizer step.

    Stage ``s`` (0 <= s < num_stages) lives on ``graph.rank_of_stage(s)``: rank
    ``s % num_ranks`` with the default ``placement`` (Megatron's interleaved placement; with
    vpp = 1 stage s is rank s), or the V / dual placement of ZB-V, DualPipeV and DualPipe
    (``plansim.specs.stage_placement``). With ``blocking_p2p`` a rank waits for each
    of its sends to complete before its next action (synchronous point-to-point, as in
    Megatron-LM without ``--overlap-p2p-communication``); otherwise sends run beside compute.
    With ``overlap_grad_reduce`` the stages' gradient buckets start on the ``dp`` stream as
    soon as they are ready, beside the remaining backward work (Megatron-LM
    ``--overlap-grad-reduce``); otherwise after the rank's last action.
    ``rank_nodes`` gives the node of each rank, for the per-node host-memory link behind
    ``pcie`` transfers; empty: every rank on a node of its own. ``overlap_slowdown``: compute
    takes ``1 + overlap_slowdown`` times longer while its rank has asynchronous communication
    in flight (``plansim.sim.overlap``); 0: no slowdown. ``overlap_fb``: an overlapped F&B
    item (DualPipe) runs its two halves at once (True), or, once both inputs are in, its
    forward then its backward (False: torch's runtime without an overlap function).

    Raises:
        SpecError: stage count not a multiple of rank count, no micro-batches,
            rank_nodes neither empty nor one non-negative node index per rank,
            overlap_slowdown outside [0, 1), or a placement its stages or micro-batches do
            not fit (``StageGraph``).
    """

    stages: tuple[StageWork, ...]
    ranks: tuple[RankWork, ...]
    num_microbatches: int
    blocking_p2p: bool = False
    overlap_grad_reduce: bool = False
    rank_nodes: tuple[int, ...] = ()
    overlap_slowdown: float = 0.0
    placement: StagePlacement = StagePlacement.LOOP
    overlap_fb: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.overlap_slowdown < 1.0:
            raise SpecError(f"overlap_slowdown must be in [0, 1), got {self.overlap_slowdown}")
        if not self.ranks or len(self.stages) % len(self.ranks):
            raise SpecError(
                f"pipeline has {len(self.stages)} stages for {len(self.ranks)} ranks; "
                "stages must be a positive multiple of ranks"
            )
        if self.num_microbatches < 1:
            raise SpecError(f"num_microbatches must be >= 1, got {self.num_microbatches}")
        if self.rank_nodes and (
            len(self.rank_nodes) != len(self.ranks) or min(self.rank_nodes) < 0
        ):
            raise SpecError(
                f"rank_nodes={self.rank_nodes} must give a node index >= 0 for each of the "
                f"{len(self.ranks)} ranks (or be empty)"
            )
        if self.placement is not StagePlacement.LOOP:
            _ = self.graph  # its checks: two stages per rank; dual: an even micro-batch count

    @property
    def num_ranks(self) -> int:
        """Pipeline-parallel ranks (pp)."""
        return len(self.ranks)

    @property
    def num_stages(self) -> int:
        """Model chunks (pp * vpp)."""
        return len(self.stages)

    @property
    def graph(self) -> StageGraph:
        """Stages, ranks and micro-batch paths (``plansim.specs.stage_placement``)."""
        return StageGraph(
            placement=self.placement,
            num_ranks=self.num_ranks,
            num_stages=self.num_stages,
            num_microbatches=self.num_microbatches,
        )

    def rank_of_stage(self, stage: int) -> int:
        """Rank holding ``stage``."""
        return rank_of_stage(self.placement, stage, num_ranks=self.num_ranks)

    def node_of_rank(self, rank: int) -> int:
        """Node holding ``rank`` (``rank_nodes``, or the rank's own when empty)."""
        return self.rank_nodes[rank] if self.rank_nodes else rank
