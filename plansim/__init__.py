"""plansim: planner and discrete-event simulator for parallel LLM training."""

__version__ = "0.1.0"
