"""Discrete-event simulation (SimPy) of one pipeline replica, and the Timeline schema."""

from plansim.sim.engine import simulate
from plansim.sim.result import SimResult
from plansim.sim.timeline import COLUMNS, make_timeline, validate_timeline

__all__ = ["COLUMNS", "SimResult", "make_timeline", "simulate", "validate_timeline"]
