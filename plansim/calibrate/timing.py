"""How ``plansim calibrate`` times each item: repetitions, warm-up, limits. Pure (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

#: Most timed repetitions of a cold (cache-flushed) call: the median of 15 single calls.
MAX_COLD_REPS = 15


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """How each item is timed.

    Attributes:
        warmup: untimed calls before timing (the first also estimates the call time).
        min_reps, max_reps: timed repetitions (the median is kept).
        target_s: aim for about this much timed work per item.
        min_rep_s: a repetition loops the call until it lasts at least this long (timer
            resolution), then divides.
        max_call_s: compute calls slower than this skip the rest of their family.
        retries: a CPU compute item is timed again (after a short pause) up to this many times
            while some rank had less than ``plan.CPU_SHARE_OK`` of a core; the attempt with the
            most CPU is kept.
    """

    warmup: int
    min_reps: int
    max_reps: int
    target_s: float
    min_rep_s: float
    max_call_s: float
    retries: int = 0

    def repetitions(self, call_s: float, *, cold: bool = False) -> tuple[int, int]:
        """(inner calls per repetition, repetitions) for a call of ``call_s`` seconds.

        ``cold``: each call is timed alone after a cache flush (:mod:`.cold_timer`), so a
        repetition is one call and there are at most :data:`MAX_COLD_REPS` of them (each flush
        costs a write of twice the largest cache).
        """
        if cold:
            reps = int(self.target_s / max(call_s, 1e-9))
            return 1, max(self.min_reps, min(self.max_reps, MAX_COLD_REPS, reps))
        inner = max(1, min(10_000, int(self.min_rep_s / max(call_s, 1e-9)) + 1))
        rep_s = max(call_s * inner, 1e-9)
        reps = int(self.target_s / rep_s)
        return inner, max(self.min_reps, min(self.max_reps, reps))


QUICK = Timing(
    warmup=1, min_reps=3, max_reps=9, target_s=0.08, min_rep_s=2e-3, max_call_s=0.12, retries=1
)
FULL = Timing(
    warmup=2, min_reps=5, max_reps=50, target_s=0.5, min_rep_s=5e-3, max_call_s=2.0, retries=3
)
