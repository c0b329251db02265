"""User-facing errors: each names the field, the value and what is allowed.

The CLI catches :class:`PlansimError` and prints its message on one line (no traceback).
"""

from __future__ import annotations

import math
from collections.abc import Iterable


class PlansimError(ValueError):
    """Base class of every error plansim reports to a user."""


class SpecError(PlansimError):
    """A model, plan or hardware spec has an invalid field."""


class UnknownNameError(PlansimError):
    """A name (model preset, hardware profile, ...) is not known."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        known_sorted = sorted(known)
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(known_sorted)}")
        self.kind = kind
        self.name = name
        self.known = known_sorted


class InputFileError(PlansimError):
    """A file (YAML profile, config.json, runs CSV) is malformed.

    The message names the file, and the row or key and field where known.
    """


def choice_error(field: str, value: object, allowed: Iterable[object]) -> SpecError:
    """Build the error for a value outside an enumerated set."""
    allowed_s = ", ".join(str(a) for a in allowed)
    return SpecError(f"{field}={value!r} is not allowed; choose one of: {allowed_s}")


def require_positive_int(field: str, value: object) -> None:
    """Raise SpecError unless value is an int >= 1 (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{field} must be a positive integer, got {value!r}")


def require_positive(field: str, value: object) -> None:
    """Raise SpecError unless value is a finite real number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SpecError(f"{field} must be a positive number, got {value!r}")
    if value != value or value == float("inf"):
        raise SpecError(f"{field} must be finite, got {value!r}")


def require_bounded(field: str, value: object, *, minimum: float, strict: bool) -> None:
    """Raise SpecError unless value is a finite real number (bools rejected) above
    ``minimum`` (``strict``) or at least ``minimum``."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        number = float(value)
        if number > minimum or (number == minimum and not strict):
            return
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    raise SpecError(f"{field} must be a finite number {bound}, got {value!r}")


def require_flags(names: tuple[str, ...], values: tuple[object, ...], *, prefix: str) -> None:
    """Raise SpecError (``choice_error``) naming the first of ``names`` whose value is not a
    bool; one tuple comparison when all are (the planner builds ~150K plans a search)."""
    if tuple(map(type, values)) == (bool,) * len(values):
        return
    for name, value in zip(names, values, strict=True):
        if type(value) is not bool:
            raise choice_error(f"{prefix}{name}", value, [True, False])
