"""Plots (the only module importing matplotlib): pipeline Gantt chart, memory over time, Pareto
(step time vs memory; time to train vs cost).

Rendering uses matplotlib's object API with the Agg canvas (no pyplot, no global figure
state), matplotlib's default style with fixed sizes and DPI, and PNGs saved without the
"Software" metadata key, so the same input gives byte-identical files. Every PNG is written
atomically (``plansim.io.outputs.write_bytes_atomic``: temporary file in the same folder, then
``os.replace``).

Inputs are in SI units (seconds, bytes); the axes show ms or s and GiB.
"""

from plansim.report.chart_layout import KIND_STYLES, pareto_front
from plansim.report.plots.gantt import gantt_figure, plot_gantt
from plansim.report.plots.memory import memory_figure, plot_memory
from plansim.report.plots.pareto import pareto_figure, plot_pareto
from plansim.report.plots.run_pareto import RunPoint, plot_run_pareto, run_pareto_figure

__all__ = [
    "KIND_STYLES",
    "RunPoint",
    "gantt_figure",
    "memory_figure",
    "pareto_figure",
    "pareto_front",
    "plot_gantt",
    "plot_memory",
    "plot_pareto",
    "plot_run_pareto",
    "run_pareto_figure",
]
