"""Interactive Plotly figures of a plan search and of a simulated step, for the HTML report
(``plansim.report.html_report``): Pareto of step time vs peak memory, the pipeline bubble
Gantt chart, memory over time per rank and the memory breakdown of the worst rank.

They show the data the PNG plots of ``plansim.report.plots`` draw, read with the same helpers
(lane layout, Gantt geometry, memory lines, Pareto front, colours per kind), so the two
agree. Inputs are in SI units (seconds, bytes); the axes show ms and GiB. Every figure is
built from its inputs alone (no random ids, no dates): the same inputs give the same JSON.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from plansim.planner.evaluate import Evaluation
from plansim.report.chart_layout import (
    IDLE_COLOUR,
    KIND_STYLES,
    SCHEDULE_COLOURS,
    GanttGeometry,
    kind_colours,
    lane_events,
    lane_offsets,
    memory_lines,
    pareto_front,
    short_label,
    short_stream,
)
from plansim.sim import timeline as tl
from plansim.specs.plan import Schedule
from plansim.units import bytes_to_gib

#: Seconds -> the axes' milliseconds.
MS_PER_S = 1e3
#: Plotly template of every figure (fixed, whatever ``plotly.io.templates.default`` says).
TEMPLATE = "plotly_white"
#: Colour per memory component (``MemoryBreakdown.as_dict`` keys); others grey.
_COMPONENT_COLOURS = {
    "activations": "#3A6FC4",
    "optimizer": "#EE8A2E",
    "weights": "#2E9E5B",
    "gradients": "#8B62C9",
    "transient": "#E8C31F",
    "reserve": "#9E9E9E",
}
_CAPACITY_COLOUR = "#D62728"
#: Millisecond axes: plain numbers with thousands separators (16,900, not 16.9k).
_MS_TICKS = {"exponentformat": "none", "separatethousands": True}
#: Decimal places kept of a millisecond value (4: 0.1 microseconds).
_MS_DECIMALS = 4


def _ms(seconds: np.ndarray) -> np.ndarray:
    """Seconds -> milliseconds rounded to the nanosecond (short, stable JSON)."""
    return np.round(np.asarray(seconds, dtype=np.float64) * MS_PER_S, _MS_DECIMALS)


def _layout(fig: go.Figure, *, title: str, height: int) -> None:
    fig.update_layout(
        template=TEMPLATE,
        title={"text": title, "x": 0.0, "xanchor": "left", "font": {"size": 14}},
        height=height,
        margin={"l": 70, "r": 150, "t": 80, "b": 50},
        hoverlabel={"namelength": -1},
    )


# ----------------------------------------------------------------------------------- Pareto


def pareto_plotly(
    evaluations: Sequence[Evaluation], *, title: str, capacity_bytes: float
) -> go.Figure:
    """Scatter of the simulated plans' step time (ms) vs peak memory per GPU (GiB).

    One trace per schedule (a fixed colour per ``Schedule`` member), the Pareto front
    (``plansim.report.plots.pareto_front``: no other plan is both as fast and as light)
    joined, the fastest plan starred, the capacity as a dashed line; hovering a point names
    its plan (``ParallelPlan.label``).

    Args:
        evaluations: simulated plans (``SearchResult.ranked``), seconds and bytes.
        title: first title line; a second counts the plans and the front.
        capacity_bytes: usable memory per GPU, bytes.

    Returns:
        The figure (no data when ``evaluations`` is empty).
    """
    xs = [round(ev.step_time_s * MS_PER_S, _MS_DECIMALS) for ev in evaluations]
    ys = [round(bytes_to_gib(ev.peak_memory_bytes), 6) for ev in evaluations]
    labels = [ev.plan.label() for ev in evaluations]
    front = list(pareto_front(list(zip(xs, ys, strict=True))))
    fig = go.Figure()
    hover = "%{text}<br>step %{x:.1f} ms<br>peak %{y:.2f} GiB<extra>%{fullData.name}</extra>"
    for i, schedule in enumerate(Schedule):
        idx = [j for j, ev in enumerate(evaluations) if ev.plan.schedule is schedule]
        if idx:
            fig.add_trace(
                go.Scatter(
                    x=[xs[j] for j in idx],
                    y=[ys[j] for j in idx],
                    text=[labels[j] for j in idx],
                    mode="markers",
                    name=schedule.value,
                    marker={"color": SCHEDULE_COLOURS[i % len(SCHEDULE_COLOURS)], "size": 8},
                    hovertemplate=hover,
                )
            )
    if front:
        fig.add_trace(
            go.Scatter(
                x=[xs[j] for j in front],
                y=[ys[j] for j in front],
                text=[short_label(evaluations[j]) for j in front],
                mode="lines+markers",
                name="Pareto front",
                line={"color": "black", "width": 1},
                marker={"symbol": "circle-open", "size": 13, "color": "black"},
                hovertemplate=hover,
            )
        )
        best = front[0]
        fig.add_trace(
            go.Scatter(
                x=[xs[best]],
                y=[ys[best]],
                text=[labels[best]],
                mode="markers",
                name="fastest",
                marker={"symbol": "star", "size": 16, "color": "#FFD700", "line": {"width": 1}},
                hovertemplate=hover,
            )
        )
    capacity_gib = bytes_to_gib(capacity_bytes)
    fig.add_hline(
        y=capacity_gib,
        line={"color": _CAPACITY_COLOUR, "dash": "dash", "width": 1.2},
        annotation_text=f"capacity {capacity_gib:.1f} GiB",
        annotation_position="top left",
    )
    _layout(
        fig,
        title=f"{title}<br><sup>{len(evaluations)} simulated plans, {len(front)} on the "
        "Pareto front</sup>",
        height=520,
    )
    fig.update_xaxes(title_text="simulated step time (ms)", **_MS_TICKS)
    fig.update_yaxes(
        title_text="peak memory per GPU (GiB)", range=[0, max([capacity_gib, *ys]) * 1.1]
    )
    return fig


# ------------------------------------------------------------------------------------ Gantt


def _lane_rows(
    timeline: pd.DataFrame, *, bases: np.ndarray, offsets: dict[str, tuple[float, float]]
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Every bar with its lane: (rows, lane top, lane height), the rows of the compute lane
    (compute and TP, as TP collectives hold the compute stream) then the thin lanes of every
    stream but compute, as the PNG Gantt chart lays them out."""
    on_compute, comm = lane_events(timeline)
    top, height = offsets["compute"]
    rows = pd.concat([on_compute, comm], ignore_index=True)
    tops = np.concatenate(
        [
            bases[on_compute[tl.RANK].to_numpy()] + top,
            bases[comm[tl.RANK].to_numpy()]
            + comm[tl.STREAM].map(lambda s: offsets[s][0]).to_numpy(dtype=np.float64),
        ]
    )
    heights = np.concatenate(
        [
            np.full(len(on_compute), height),
            comm[tl.STREAM].map(lambda s: offsets[s][1]).to_numpy(dtype=np.float64),
        ]
    )
    return rows, tops, heights


def _ordered_kinds(kinds: set[str]) -> list[str]:
    """Kinds in ``KIND_STYLES`` order, unknown ones after in name order (the PNG legend's)."""
    return [k for k in KIND_STYLES if k in kinds] + sorted(kinds - set(KIND_STYLES))


def gantt_plotly(timeline: pd.DataFrame, *, title: str) -> go.Figure:
    """The pipeline bubble Gantt chart of one step as horizontal Plotly bars.

    One block per pipeline rank (rank 0 on top): the compute lane (F, B, I, W, R, optimizer;
    TP collectives too, as they hold the compute stream) and thin lanes for the streams with
    events (tp, pp_send, pp_recv, dp), laid out as ``plansim.report.plots.gantt_figure``;
    one trace per kind (colours of ``KIND_STYLES``), later model chunks fainter when vpp > 1;
    each rank's idle fraction of the pipeline time at the right
    (``plansim.sim.timeline.bubble_fractions``); dashed line: end of the pipeline work,
    solid: step end. Hovering a bar gives its rank, micro-batch, stage, start and length.

    Args:
        timeline: Timeline schema (``plansim.sim.timeline``), seconds.
        title: first title line; a second gives step time, pipeline time and mean bubble.

    Returns:
        The figure (times in ms).
    """
    geo = GanttGeometry.of(timeline)
    offsets, pitch = lane_offsets([str(s) for s in timeline[tl.STREAM].unique()])
    bases = np.arange(geo.num_ranks) * pitch
    rows, tops, heights = _lane_rows(timeline, bases=bases, offsets=offsets)
    colours = kind_colours(sorted({str(k) for k in rows[tl.KIND].unique()}))
    fig = go.Figure()
    step_ms, pipeline_ms = geo.step_s * MS_PER_S, geo.pipeline_s * MS_PER_S
    for r in range(geo.num_ranks):
        for top, height in offsets.values():
            y0 = float(bases[r] + top)
            fig.add_shape(
                type="rect",
                x0=0.0,
                x1=step_ms if step_ms > 0 else 1.0,
                y0=y0,
                y1=y0 + height,
                fillcolor=IDLE_COLOUR,
                line={"width": 0},
                layer="below",
            )
    shown: set[str] = set()
    kinds = rows[tl.KIND].to_numpy()
    for kind in _ordered_kinds({str(k) for k in kinds}):
        mask = kinds == kind
        own = rows[mask]
        name = KIND_STYLES.get(kind, (None, kind))[1]
        start = _ms(own[tl.START_S].to_numpy())
        end = _ms(own[tl.END_S].to_numpy())
        ids = own[[tl.RANK, tl.MICROBATCH, tl.STAGE]].to_numpy(dtype=np.float64)
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=start.tolist(),
                x=(end - start).astype(np.float32),
                y=(tops[mask] + heights[mask] / 2).astype(np.float32),
                width=heights[mask].astype(np.float32),
                name=name,
                legendgroup=name,
                showlegend=name not in shown,
                marker={
                    "color": colours[kind],
                    "line": {"width": 0},
                    "opacity": _chunk_opacity(own, num_ranks=geo.num_ranks, vpp=geo.vpp),
                },
                customdata=np.column_stack([start, ids]),
                hovertemplate=f"{kind}<br>rank %{{customdata[1]}}, micro-batch "
                "%{customdata[2]}, stage %{customdata[3]}<br>from %{customdata[0]:.3f} ms, "
                "%{x:.3f} ms long<extra></extra>",
            )
        )
        shown.add(name)
    idle = tl.bubble_fractions(timeline, num_ranks=geo.num_ranks, pipeline_time_s=geo.pipeline_s)
    _gantt_marks(fig, idle=idle, bases=bases, step_ms=step_ms, pipeline_ms=pipeline_ms)
    thin = [short_stream(s) for s in offsets if s != "compute"]
    lanes = f"; thin lanes under each rank, top to bottom: {', '.join(thin)}" if thin else ""
    mean_idle = 100 * sum(idle) / len(idle) if idle else 0.0
    _layout(
        fig,
        title=f"{title}<br><sup>step {step_ms:.4g} ms, pipeline work until {pipeline_ms:.4g} "
        f"ms, mean bubble {mean_idle:.1f}%{lanes}</sup>",
        height=200 + geo.num_ranks * (90 if geo.num_ranks <= 8 else 70),
    )
    fig.update_layout(
        barmode="overlay",
        bargap=0,
        legend={"orientation": "h", "x": 0.0, "y": -0.1, "yanchor": "top"},
        margin={"l": 70, "r": 90, "t": 80, "b": 120},
    )
    fig.update_xaxes(
        title_text="time (ms)",
        range=[0, step_ms * 1.005 if step_ms > 0 else 1.0],
        **_MS_TICKS,
    )
    fig.update_yaxes(
        range=[geo.num_ranks * pitch + 0.1, -0.1],
        tickvals=(bases + 0.5).tolist(),
        ticktext=[f"rank {r}" for r in range(geo.num_ranks)],
        showgrid=False,
        zeroline=False,
    )
    return fig


def _chunk_opacity(rows: pd.DataFrame, *, num_ranks: int, vpp: int) -> float | np.ndarray:
    """1 for every bar, or with vpp > 1 fainter for later model chunks (down to 0.5 for the
    last, as the PNG chart lightens them towards white)."""
    if vpp <= 1:
        return 1.0
    chunk = np.maximum(rows[tl.STAGE].to_numpy(), 0) // num_ranks
    return (1.0 - 0.5 * chunk / (vpp - 1)).astype(np.float32)


def _gantt_marks(
    fig: go.Figure,
    *,
    idle: Sequence[float],
    bases: np.ndarray,
    step_ms: float,
    pipeline_ms: float,
) -> None:
    """Per-rank idle fraction at the right; pipeline-end (dashed) and step-end lines."""
    for base, fraction in zip(bases, idle, strict=True):
        fig.add_annotation(
            x=1.0,
            xref="paper",
            xanchor="left",
            y=float(base + 0.5),
            text=f"idle {100 * fraction:.1f}%",
            showarrow=False,
            font={"size": 11},
        )
    fig.add_vline(
        x=pipeline_ms,
        line={"color": "#444444", "dash": "dash", "width": 1},
        annotation_text="pipeline end",
        annotation_position="top left",
    )
    fig.add_vline(
        x=step_ms,
        line={"color": "black", "width": 1.5},
        annotation_text="step end",
        annotation_position="top right",
    )


# ----------------------------------------------------------------------------------- memory


def memory_plotly(
    memory: pd.DataFrame, *, title: str, capacity_bytes: float, end_s: float | None = None
) -> go.Figure:
    """Memory per GPU over time, one step line per rank, with the capacity and the peak.

    Args:
        memory: samples ``rank, time_s, bytes`` (``SimResult.memory``).
        title: figure title.
        capacity_bytes: usable memory per GPU, bytes (dashed red line).
        end_s: extend every line to this time, seconds (the step end); default the last
            sample.

    Returns:
        The figure (ms, GiB); the highest sample is marked with its rank.
    """
    end = max(float(memory["time_s"].max()) if len(memory) else 0.0, end_s or 0.0)
    lines = memory_lines(memory, end_s=end, scale=MS_PER_S)
    fig = go.Figure()
    for rank, t, gib in lines:
        fig.add_trace(
            go.Scatter(
                x=np.round(t, _MS_DECIMALS),
                y=np.round(gib, 6),
                mode="lines",
                line={"shape": "hv", "width": 1.3},
                name=f"rank {rank}",
                hovertemplate="%{x:.3f} ms<br>%{y:.3f} GiB<extra>%{fullData.name}</extra>",
            )
        )
    capacity_gib = bytes_to_gib(capacity_bytes)
    peak_gib = max((float(g.max()) for _, _, g in lines), default=0.0)
    note = f"capacity {capacity_gib:.1f} GiB, headroom at peak {capacity_gib - peak_gib:.1f} GiB"
    fig.add_hline(
        y=capacity_gib,
        line={"color": _CAPACITY_COLOUR, "dash": "dash", "width": 1.2},
        annotation_text=note,
        annotation_position="top left",
    )
    if lines:
        rank, t, gib = max(lines, key=lambda line: (float(line[2].max()), -line[0]))
        j = int(np.argmax(gib))
        fig.add_annotation(
            x=float(t[j]),
            y=float(gib[j]),
            text=f"peak {gib[j]:.2f} GiB (rank {rank})",
            showarrow=True,
            arrowhead=2,
            ax=40,
            ay=-30,
        )
    _layout(fig, title=title, height=480)
    fig.update_xaxes(
        title_text="time (ms)", range=[0, end * MS_PER_S if end > 0 else 1.0], **_MS_TICKS
    )
    fig.update_yaxes(
        title_text="memory per GPU (GiB)", range=[0, max(capacity_gib, peak_gib) * 1.1 or 1.0]
    )
    return fig


def breakdown_plotly(
    components_bytes: dict[str, float], *, title: str, capacity_bytes: float
) -> go.Figure:
    """One stacked bar of a rank's memory by component (weights, gradients, optimizer state,
    activations, ... as ``MemoryBreakdown.as_dict`` names them), against the capacity.

    Args:
        components_bytes: component -> bytes, in the order to stack them.
        title: figure title.
        capacity_bytes: usable memory per GPU, bytes (dashed red line).

    Returns:
        The figure (GiB).
    """
    fig = go.Figure()
    for name, num_bytes in components_bytes.items():
        gib = round(bytes_to_gib(num_bytes), 6)
        fig.add_trace(
            go.Bar(
                orientation="h",
                x=[gib],
                y=["memory"],
                name=f"{name} {gib:.2f} GiB",
                marker={"color": _COMPONENT_COLOURS.get(name, "#BBBBBB")},
                hovertemplate=f"{name}<br>%{{x:.3f}} GiB<extra></extra>",
            )
        )
    capacity_gib = bytes_to_gib(capacity_bytes)
    total_gib = bytes_to_gib(sum(components_bytes.values()))
    fig.add_vline(
        x=capacity_gib,
        line={"color": _CAPACITY_COLOUR, "dash": "dash", "width": 1.2},
        annotation_text=f"capacity {capacity_gib:.1f} GiB",
        annotation_position="top",
    )
    _layout(fig, title=f"{title}<br><sup>total {total_gib:.2f} GiB</sup>", height=260)
    fig.update_layout(
        barmode="stack", legend={"orientation": "h", "y": -0.35, "traceorder": "normal"}
    )
    fig.update_xaxes(title_text="GiB", range=[0, max(capacity_gib, total_gib) * 1.05 or 1.0])
    fig.update_yaxes(showticklabels=False)
    return fig
