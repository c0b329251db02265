"""Rejected plans in a compact form that crosses process boundaries cheaply (pure).

A planner search rejects most of its candidates (``make demo``: 103,239 of 152,171) and
keeps every rejection (``SearchResult.rejected``). Pickling a ``ParallelPlan`` back from a
worker process costs more than checking it, so a layout's costing carries its rejections as
rows: each plan's field values (a tuple of plain values, which pickle writes and reads in
C), its category, reason and needed bytes. :class:`Rejections` reads the rows of a whole
search as a sequence of :class:`~plansim.planner.evaluate.Rejected` and builds each
``Rejected`` (its plan validated again by ``ParallelPlan``) only when it is read; counts,
examples and the plan closest to fitting come from the rows directly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import overload

from plansim.planner.evaluate import OUT_OF_MEMORY, Rejected
from plansim.specs.plan import FIELD_PATHS, PLAN_FIELDS, ParallelPlan, plan_from_fields

#: A plan's row values: its flat fields (``PLAN_FIELDS``), in order.
plan_values = attrgetter(*(FIELD_PATHS[name] for name in PLAN_FIELDS))


def plan_from_values(values: tuple[object, ...]) -> ParallelPlan:
    """The plan whose :data:`plan_values` are ``values`` (validated as any plan)."""
    return plan_from_fields(**dict(zip(PLAN_FIELDS, values, strict=True)))


@dataclass(slots=True)
class RejectedRows:
    """Rejections of one task (a layout's costing), one row each, in rejection order.

    Attributes:
        plans: each plan's :data:`plan_values`.
        categories, reasons, need_bytes: ``Rejected``'s fields of the same rows.
    """

    plans: list[tuple[object, ...]] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    need_bytes: list[float] = field(default_factory=list)

    def add(self, why: Rejected, plans: Iterable[ParallelPlan]) -> None:
        """Append one row per plan of ``plans``, each rejected as ``why`` says."""
        for plan in plans:
            self.plans.append(plan_values(plan))
            self.categories.append(why.category)
            self.reasons.append(why.reason)
            self.need_bytes.append(why.need_bytes)

    def __len__(self) -> int:
        return len(self.plans)

    def rejected(self, i: int) -> Rejected:
        """Row ``i`` as a Rejected."""
        return Rejected(
            plan=plan_from_values(self.plans[i]),
            category=self.categories[i],
            reason=self.reasons[i],
            need_bytes=self.need_bytes[i],
        )


class Rejections(Sequence[Rejected]):
    """Every rejection of a search, in order: costing rows, then rejections of simulated
    plans (``Rejected`` objects). Sequence of Rejected; equal to any sequence of the same
    Rejected in the same order.
    """

    def __init__(self, rows: Sequence[RejectedRows], extra: Sequence[Rejected] = ()) -> None:
        self._parts: tuple[Part, ...] = (
            *(r for r in rows if len(r)),
            tuple(extra),
        )
        self._len = sum(len(p) for p in self._parts)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Rejected: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Rejected, ...]: ...
    def __getitem__(self, index: int | slice) -> Rejected | tuple[Rejected, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(self._len)))
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(f"rejection index {index} out of range (0..{self._len - 1})")
        for part in self._parts:
            if index < len(part):
                return _item(part, index)
            index -= len(part)
        raise AssertionError("unreachable: index checked against the length")

    def __iter__(self) -> Iterator[Rejected]:
        for part in self._parts:
            yield from (_item(part, i) for i in range(len(part)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Rejections({self._len} rejected plans)"

    def _fields(self) -> Iterator[tuple[str, str, float, Part, int]]:
        """(category, reason, need_bytes, part, index in it) per rejection, in order,
        without building any plan."""
        for part in self._parts:
            if isinstance(part, RejectedRows):
                for i in range(len(part)):
                    yield part.categories[i], part.reasons[i], part.need_bytes[i], part, i
            else:
                for i, r in enumerate(part):
                    yield r.category, r.reason, r.need_bytes, part, i

    def counts(self) -> Counter[str]:
        """Rejections per category."""
        return Counter(category for category, *_ in self._fields())

    def examples(self) -> dict[str, str]:
        """The first rejection's reason per category, categories in first-seen order."""
        out: dict[str, str] = {}
        for category, reason, *_ in self._fields():
            out.setdefault(category, reason)
        return out

    def closest_miss(self) -> Rejected | None:
        """The out-of-memory rejection whose plan needs the least memory (ties: the first),
        or None without one."""
        best: tuple[float, Part, int] | None = None
        for category, _, need, part, i in self._fields():
            if category == OUT_OF_MEMORY and (best is None or need < best[0]):
                best = (need, part, i)
        return None if best is None else _item(best[1], best[2])


Part = RejectedRows | tuple[Rejected, ...]


def _item(part: Part, i: int) -> Rejected:
    """Rejection ``i`` of a part: built from its row, or the Rejected itself."""
    return part.rejected(i) if isinstance(part, RejectedRows) else part[i]
