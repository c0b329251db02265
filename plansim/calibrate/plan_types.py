"""The calibration plan's data: one measurement (:class:`Item`) and the ordered plan
(:class:`Plan`). Pure (no torch); built by ``plansim.calibrate.plan.build_plan``."""

from __future__ import annotations

from dataclasses import dataclass

from plansim.calibrate.timing import Timing


@dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """One measurement.

    Attributes:
        kind: ``gemm``, ``attention``, ``stream``, ``launch``, ``host_op``, ``adam``,
            ``copy``, ``collective``, ``overlap`` or ``sustained``.
        op: what runs (``mlp_up``, ``sdpa_fwd``, ``add``, ``all_reduce``, ``h2d``,
            ``gemm_beside_all_reduce``, ...).
        dtype: element type (``fp32``, ``bf16``, ...); ``fp32`` for streams and Adam.
        shape: gemm (m, n, k); attention (batch, heads, seq, head_dim); stream (elements,);
            launch (1,); host_op (ops in the chain,), or for a pipeline chain (ops per
            stage, micro-batches); adam (parameters,); copy (bytes,);
            collective (message bytes,); overlap (m, n, k, all_reduce message bytes);
            sustained (m, n, k, soak milliseconds).
        group_size: ranks taking part (1 for compute: every rank runs its own copy; overlap:
            the ranks of the all_reduce; sustained: every rank, at once).
        work: per call: FLOPs (gemm, attention, overlap, sustained: one GEMM), bytes (stream, copy,
            collective), parameters (adam), 1 (launch), ops in the chain (host_op), actions
            on a GPipe pipeline's critical path, micro-batches + ranks - 1 (pipeline chain).
        work_unit: ``flop``, ``byte``, ``param``, ``call``, ``op`` or ``action``.
        sweep: which pass over the GEMMs and collectives (0, 1, ...); see :func:`build_plan`.
    """

    kind: str
    op: str
    dtype: str
    shape: tuple[int, ...]
    group_size: int = 1
    work: float
    work_unit: str
    sweep: int = 0

    @property
    def shape_text(self) -> str:
        """``512x2048x512`` (the raw CSV's ``shape`` column)."""
        return "x".join(str(s) for s in self.shape)

    def raw_columns(self) -> dict[str, object]:
        """The item's columns of a raw timing row (``plansim.calibrate.raw``)."""
        names = ("kind", "op", "dtype", "group_size", "work", "work_unit", "sweep")
        return {**{n: getattr(self, n) for n in names}, "shape": self.shape_text}

    @property
    def label(self) -> str:
        """What the progress bar shows."""
        group = f" over {self.group_size} ranks" if self.kind in ("collective", "overlap") else ""
        sweep = f" (pass {self.sweep + 1})" if self.sweep else ""
        text = f"{self.kind} {self.op} {self.dtype} {self.shape_text}{group}{sweep}"
        return text.replace("  ", " ")

    @property
    def family(self) -> str:
        """Items skipped together once one call is too slow (one GEMM or attention dtype)."""
        return f"{self.kind}/{self.op if self.kind == 'attention' else ''}/{self.dtype}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The ordered items and their timing policy."""

    items: tuple[Item, ...]
    timing: Timing
    group_sizes: tuple[int, ...]
    quick: bool
