"""Pipeline actions in the ``torch.distributed.pipelining`` alphabet, and their text forms.

An action is one computation of one pipeline stage on one micro-batch. Its string is the
one torch's ``_Action`` prints: stage index, computation letter, micro-batch index
(``"0F1"``, ``"1B0"``, ``"2I0"``, ``"0W2"``). The letters are torch's ``_ComputationType``
values: ``F`` forward, ``B`` full backward, ``I`` backward-input (input gradient),
``W`` backward-weight (weight gradient). DualPipe's overlapped forward and backward of two
micro-batches is one :class:`OverlapFB` item, printed as torch prints its ``OVERLAP_F_B``
action: ``"(0F3;1B2)OVERLAP_F_B"``. Only compute actions are modelled here; torch's
communication and FSDP actions (``SEND_F``, ``UNSHARD``, ``REDUCE_GRAD``, ...) are implied
by the simulator.

A schedule is a tuple per pipeline rank of actions in execution order
(:data:`PerRankActions`). Its CSV form is the one torch's ``_dump_csv`` / ``_load_csv``
write and read: one row per rank, one cell per step, empty cells for idle steps.

Pure module: no torch import, no file access (``plansim.io`` owns the files).
"""

from __future__ import annotations

import csv
import enum
import io
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from plansim.errors import InputFileError, SpecError


class ActionKind(str, enum.Enum):
    """Computation type of an action; values are torch's ``_ComputationType`` letters.

    A ``str`` mix-in like torch's ``_ComputationType(str, Enum)``: members hash as their
    letter (C speed; plain Enum hashing dominated the checks' run time).
    """

    FORWARD = "F"
    FULL_BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"


_KIND_BY_LETTER = {kind.value: kind for kind in ActionKind}
_ACTION_RE = re.compile(r"(\d+)([FBIW])(\d+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One compute action: ``kind`` of pipeline ``stage`` on micro-batch ``microbatch``.

    Attributes:
        stage: pipeline stage (model chunk) index, 0-based.
        kind: F, B, I or W.
        microbatch: micro-batch index, 0-based.

    Raises:
        SpecError: a negative or non-integer index.
    """

    stage: int
    kind: ActionKind
    microbatch: int

    def __post_init__(self) -> None:
        for name in ("stage", "microbatch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"action.{name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.kind, ActionKind):
            raise SpecError(f"action.kind must be an ActionKind, got {self.kind!r}")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse torch's action string, e.g. ``"0F1"`` (surrounding blanks allowed).

        Raises:
            SpecError: ``text`` is not ``<stage><F|B|I|W><micro-batch>``.
        """
        match = _ACTION_RE.fullmatch(text.strip())
        if match is None:
            raise SpecError(
                f"malformed action {text!r}; expected <stage><F|B|I|W><micro-batch>, "
                "e.g. '0F1' (stage 0, forward, micro-batch 1)"
            )
        stage, letter, microbatch = match.groups()
        return cls(stage=int(stage), kind=_KIND_BY_LETTER[letter], microbatch=int(microbatch))


_OVERLAP_SUFFIX = "OVERLAP_F_B"


@dataclass(frozen=True, slots=True, kw_only=True)
class OverlapFB:
    """A forward and a backward (B, or I) of two micro-batches run at once on one rank, one
    chunk's communication hidden behind the other's compute (DualPipe's overlapped chunk,
    DeepSeek-V3 report arXiv:2412.19437 §3.2.1 Fig. 4; torch ``OVERLAP_F_B`` with these two
    sub-actions).

    Raises:
        SpecError: ``forward`` is not an F, or ``backward`` is not a B or I.
    """

    forward: Action
    backward: Action

    def __post_init__(self) -> None:
        if not isinstance(self.forward, Action) or self.forward.kind is not ActionKind.FORWARD:
            raise SpecError(f"overlap forward must be an F action, got {self.forward!r}")
        if not isinstance(self.backward, Action) or self.backward.kind not in (
            ActionKind.FULL_BACKWARD,
            ActionKind.BACKWARD_INPUT,
        ):
            raise SpecError(f"overlap backward must be a B or I action, got {self.backward!r}")

    def __str__(self) -> str:
        return f"({self.forward};{self.backward}){_OVERLAP_SUFFIX}"

    @property
    def parts(self) -> tuple[Action, Action]:
        """The two sub-actions, forward first (torch runs them in this order)."""
        return (self.forward, self.backward)


#: One entry of a rank's list: a compute action or an overlapped forward/backward pair.
ScheduleItem = Action | OverlapFB

#: Actions of each pipeline rank in execution order: ``actions[rank][step]``.
PerRankActions = tuple[tuple[ScheduleItem, ...], ...]

#: A timestep grid: ``grid[rank][timestep]`` is an item, or None for an idle step.
Grid = Sequence[Sequence[ScheduleItem | None]]


def parts(item: ScheduleItem) -> tuple[Action, ...]:
    """The compute actions of a list item: itself, or an overlap's forward and backward."""
    return item.parts if isinstance(item, OverlapFB) else (item,)


def parse_item(text: str) -> ScheduleItem:
    """Parse an action (``"0F1"``) or torch's overlap form (``"(0F3;1B2)OVERLAP_F_B"``).

    Raises:
        SpecError: neither form, or an overlap without exactly one F and one B/I.
    """
    text = text.strip()
    if not text.startswith("("):
        return Action.parse(text)
    inner, sep, suffix = text[1:].partition(")")
    pieces = inner.split(";")
    if not sep or suffix != _OVERLAP_SUFFIX or len(pieces) != 2:
        raise SpecError(
            f"malformed overlap {text!r}; expected (<forward>;<backward>){_OVERLAP_SUFFIX}, "
            "e.g. '(0F3;1B2)OVERLAP_F_B'"
        )
    return OverlapFB(forward=Action.parse(pieces[0]), backward=Action.parse(pieces[1]))


def format_actions_csv(actions: Grid) -> str:
    """Write per-rank actions as torch's schedule CSV: one row per rank, one cell per step.

    Idle steps (None) become empty cells, as in torch's ``_dump_csv``.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for row in actions:
        writer.writerow(["" if action is None else str(action) for action in row])
    return buffer.getvalue()


def parse_actions_csv(text: str, *, source: str = "<csv>") -> PerRankActions:
    """Read torch's schedule CSV (compute-only format) into per-rank actions.

    Empty cells (idle steps) are dropped, as torch's ``_Action.from_str`` maps them to None;
    overlap cells read as :class:`OverlapFB`.

    Args:
        text: the CSV text; row ``r`` holds rank ``r``.
        source: file name used in error messages.

    Raises:
        InputFileError: a cell is not a compute action string; names the row and column.
    """
    per_rank: list[tuple[ScheduleItem, ...]] = []
    for rank, row in enumerate(csv.reader(io.StringIO(text))):
        actions: list[ScheduleItem] = []
        for step, cell in enumerate(row):
            if not cell.strip():
                continue
            try:
                actions.append(parse_item(cell))
            except SpecError as exc:
                raise InputFileError(f"{source}: row {rank} (rank), column {step}: {exc}") from exc
        per_rank.append(tuple(actions))
    return tuple(per_rank)


def format_grid(
    grid: Grid,
    *,
    error_step: int | None = None,
    flagged: Collection[tuple[int, int]] = (),
) -> str:
    """Format a timestep (row) x rank (column) grid of actions, like torch's
    ``_format_pipeline_order``.

    Args:
        grid: ``grid[rank][step]``; None or missing cells print blank.
        error_step: this row gets a ``<-- ERROR HERE`` marker.
        flagged: ``(rank, step)`` cells printed in brackets, e.g. ``[0B1]``.

    Returns:
        The table, one line per step under a header of rank labels, ending in a newline.
    """
    num_steps = max((len(row) for row in grid), default=0)
    width = len(str(max(num_steps - 1, 0)))
    step_labels = [f"Step {step:0{width}d}" for step in range(num_steps)]
    columns: list[list[str]] = []
    for rank, row in enumerate(grid):
        texts = ["" if action is None else str(action) for action in row]
        texts += [""] * (num_steps - len(texts))
        flagged_texts = [
            f"[{text}]" if (rank, step) in flagged else text for step, text in enumerate(texts)
        ]
        columns.append([f"Rank {rank}", *flagged_texts])
    widths = [max(len(text) for text in column) for column in columns]
    indent = " " * (len(step_labels[0]) + 2 if step_labels else 0)
    header = indent + " ".join(c[0].ljust(w) for c, w in zip(columns, widths, strict=True))
    lines = [header.rstrip()]
    for step, label in enumerate(step_labels, start=1):
        row_text = " ".join(c[step].ljust(w) for c, w in zip(columns, widths, strict=True))
        marker = " <-- ERROR HERE" if step - 1 == error_step else ""
        lines.append(f"{label}: {row_text}".rstrip() + marker)
    return "\n".join(lines) + "\n"
