"""Self-contained HTML reports of a plan search and of a simulated plan (``--report``).

One file that opens offline: the Plotly JS bundle is inlined once (``include_plotlyjs=True``
on the first figure, never a CDN), the figures of ``plansim.report.plotly_figures`` follow
as divs with fixed ids, the tables are plain HTML (the ranked table sorts by a click on a
column header, with a small inline script), and nothing random or time-dependent enters the
page (no dates, no generated ids): the same inputs give byte-identical files. A tiny
recorder at the top of the page writes any script error into ``<pre id="report-errors">``
(hidden while empty), so a browser test can tell that every script ran.

Inputs are in SI units (seconds, bytes); the page shows ms and GiB, and the tables keep the
columns the commands print. Files are written atomically (``plansim.io.outputs``).
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from plansim.io.outputs import write_text_atomic
from plansim.planner.evaluate import Evaluation
from plansim.planner.search import SearchResult
from plansim.report import plotly_figures as figs
from plansim.report.tables import memory_table
from plansim.sim import timeline as tl

#: id of the element the error recorder writes into.
ERRORS_ID = "report-errors"
#: Records script errors and unhandled promise rejections into ``#report-errors``; queued
#: until the element exists. First script of the page, so it sees every later one.
ERROR_RECORDER = f"""<script>
(function () {{
  var pending = [];
  function record(text) {{
    var out = document.getElementById("{ERRORS_ID}");
    if (!out) {{ pending.push(text); return; }}
    out.textContent += text + "\\n";
    out.hidden = false;
  }}
  window.addEventListener("error", function (e) {{
    var where = e.filename ? " (" + e.filename + ":" + e.lineno + ")" : "";
    record("error: " + (e.message || (e.target && e.target.tagName) || e.type) + where);
  }}, true);
  window.addEventListener("unhandledrejection", function (e) {{
    record("unhandled rejection: " + (e.reason && e.reason.stack || e.reason));
  }});
  document.addEventListener("DOMContentLoaded", function () {{
    var queued = pending; pending = [];
    queued.forEach(record);
  }});
}})();
</script>"""
#: Sorts a ``table.sortable`` by the clicked header: numerically when both cells are
#: numbers, else as text; a second click reverses.
_SORT_SCRIPT = """<script>
(function () {
  function number(text) {
    var t = text.trim();
    return t !== "" && !isNaN(Number(t)) ? Number(t) : null;
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var heads = table.querySelectorAll("thead th");
    heads.forEach(function (th, col) {
      th.addEventListener("click", function () {
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[col].textContent, y = b.cells[col].textContent;
          var nx = number(x), ny = number(y);
          var c = nx !== null && ny !== null ? nx - ny : x.localeCompare(y);
          return ascending ? c : -c;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
})();
</script>"""
_CSS = """<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em 2em;
  color: #222; max-width: 1800px; }
h1 { font-size: 1.35em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
p.heading { color: #444; margin-top: 0.2em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.55em; text-align: right;
  white-space: nowrap; }
table#rejections td { white-space: normal; }
th { background: #f4f4f4; }
td.text, th.text { text-align: left; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[aria-sort="ascending"]::after { content: " \\25B2"; }
table.sortable th[aria-sort="descending"]::after { content: " \\25BC"; }
pre { background: #f8f8f8; padding: 0.6em; font-size: 0.85em; white-space: pre-wrap; }
pre#report-errors { background: #fdd; color: #900; }
.note { color: #555; font-size: 0.9em; }
.scroll { overflow-x: auto; }
</style>"""
#: Plotly config of every figure: no logo link, resizes with the window.
_CONFIG = {"displaylogo": False, "responsive": True}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanPage:
    """What ``plansim plan --report`` shows, in the command's own terms.

    Attributes:
        title: the page's title (model, GPUs, batch).
        heading: the line the command prints above its table.
        table: the ranked table as the command prints it (edge units in column names).
        labels: ``ParallelPlan.label()`` of each table row, in row order.
        result: the search (counts, rejections, every simulated plan for the Pareto).
        best: rank 1 of the table (its simulated step), or None when no plan is feasible.
        capacity_bytes: usable memory per GPU, bytes.
        shown_note: which micro-batches the best plan's timeline covers ('' when all).
        notes: further lines the command prints (batch note, lookups, run notes).
    """

    title: str
    heading: str
    table: pd.DataFrame
    labels: tuple[str, ...]
    result: SearchResult
    best: Evaluation | None
    capacity_bytes: float
    shown_note: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatePage:
    """What ``plansim simulate --report`` shows.

    Attributes:
        title: the page's title (model, GPUs, plan label).
        tables: (caption, table) pairs of the printed report (metrics, where the step goes,
            memory), edge units.
        outcome: the simulated plan (its timeline and memory samples are drawn).
        capacity_bytes: usable memory per GPU, bytes.
        shown_note: which micro-batches the timeline covers ('' when all).
        notes: further lines of the printed report (layer times, pace, lookups).
    """

    title: str
    tables: tuple[tuple[str, pd.DataFrame], ...]
    outcome: Evaluation
    capacity_bytes: float
    shown_note: str = ""
    notes: tuple[str, ...] = ()


def _cell(value: Any) -> str:
    """A table cell's text: '' for missing values, else ``str`` (as pandas prints a CSV)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def table_html(
    df: pd.DataFrame, *, table_id: str, sortable: bool = False, text_columns: Sequence[str] = ()
) -> str:
    """``df`` as an HTML table (every cell escaped; numbers right-aligned, ``text_columns``
    left-aligned).

    Args:
        df: the table; its column names are the header.
        table_id: the table's ``id``.
        sortable: give it class ``sortable`` (sorted by a click on a header).
        text_columns: columns shown left-aligned.

    Returns:
        ``<table>...</table>``.
    """
    columns = [str(c) for c in df.columns]
    text = set(text_columns)

    def cls(column: str) -> str:
        return ' class="text"' if column in text else ""

    head = "".join(f"<th{cls(c)}>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in df.itertuples(index=False, name=None):
        cells = "".join(
            f"<td{cls(c)}>{html.escape(_cell(v))}</td>" for c, v in zip(columns, row, strict=True)
        )
        body.append(f"<tr>{cells}</tr>")
    klass = ' class="sortable"' if sortable else ""
    return (
        f'<table id="{html.escape(table_id)}"{klass}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


class _Figures:
    """Figures to HTML divs: the Plotly bundle inlined with the first one only."""

    def __init__(self) -> None:
        self._bundled = False

    def div(self, fig: Any, *, div_id: str) -> str:
        """``fig`` as a div with id ``div_id`` and its script (no generated ids)."""
        out = fig.to_html(
            full_html=False,
            include_plotlyjs=not self._bundled,
            include_mathjax=False,
            div_id=div_id,
            config=_CONFIG,
            default_width="100%",
        )
        self._bundled = True
        return str(out)


def _text_columns(df: pd.DataFrame) -> list[str]:
    """The columns that do not hold numbers (shown left-aligned)."""
    return [str(c) for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])]


def _pre(lines: Sequence[str], *, klass: str = "note") -> str:
    text = "\n".join(line.rstrip("\n") for line in lines if line.strip())
    return f'<pre class="{klass}">{html.escape(text)}</pre>' if text else ""


def _page(title: str, body: Sequence[str]) -> str:
    """The whole document: head (title, style, error recorder), ``body``, sort script."""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(title)}</title>",
            ERROR_RECORDER,
            _CSS,
            "</head>",
            "<body>",
            f'<pre id="{ERRORS_ID}" hidden></pre>',
            *body,
            _SORT_SCRIPT,
            "</body>",
            "</html>",
            "",
        ]
    )


def _step_sections(
    ev: Evaluation,
    figures: _Figures,
    *,
    title: str,
    capacity_bytes: float,
    shown_note: str,
    with_table: bool,
) -> list[str]:
    """Bubble Gantt, memory over time and memory breakdown of ``ev`` (and its table when
    ``with_table``)."""
    result = ev.result
    end_s = float(result.timeline[tl.END_S].max()) if len(result.timeline) else 0.0
    worst = f"worst pipeline rank (stage {ev.memory.rank})"
    parts = ["<h2>Pipeline bubble Gantt chart</h2>"]
    if shown_note:
        parts.append(f'<p class="note">{html.escape(shown_note)}</p>')
    parts.append(figures.div(figs.gantt_plotly(result.timeline, title=title), div_id="gantt"))
    parts.append("<h2>Memory over time</h2>")
    memory = figs.memory_plotly(
        result.memory, title=title, capacity_bytes=capacity_bytes, end_s=end_s
    )
    parts.append(figures.div(memory, div_id="memory"))
    parts.append(f"<h2>Memory breakdown, {html.escape(worst)}</h2>")
    breakdown = figs.breakdown_plotly(
        ev.memory.as_dict(), title=f"memory of the {worst}", capacity_bytes=capacity_bytes
    )
    parts.append(figures.div(breakdown, div_id="memory-breakdown"))
    if with_table:
        table = table_html(memory_table(ev), table_id="memory-table", text_columns=["component"])
        parts.append(table)
    return parts


def _search_counts(result: SearchResult) -> pd.DataFrame:
    """Candidates enumerated, feasible, simulated, not simulated and rejected."""
    rows = [
        ("candidates", result.num_candidates),
        ("feasible", result.num_feasible),
        ("simulated as events", result.num_simulated),
        ("not simulated", result.num_not_simulated),
        ("rejected", sum(result.rejection_counts.values())),
    ]
    return pd.DataFrame(rows, columns=["plans", "count"])


def _rejections(result: SearchResult) -> pd.DataFrame:
    """Why candidates were rejected: count, reason and the example the command prints."""
    rows = [
        (count, category, result.rejection_examples.get(category, ""))
        for category, count in result.rejection_counts.items()
    ]
    return pd.DataFrame(rows, columns=["count", "reason", "example"])


def plan_report_html(page: PlanPage) -> str:
    """The report of one plan search as a self-contained HTML document.

    Sections: the ranked table (sortable; a last ``plan`` column names each row's plan), the
    search's counts and rejection reasons, the Pareto of step time vs peak memory over every
    simulated plan, and for rank 1 its bubble Gantt chart, memory over time and memory
    breakdown (none of those when no plan is feasible).

    Args:
        page: what to show (:class:`PlanPage`).

    Returns:
        The document's text (same inputs, same text).
    """
    figures = _Figures()
    table = page.table.copy()
    if len(table):
        table["plan"] = list(page.labels)
    body = [f"<h1>{html.escape(page.title)}</h1>"]
    body.append(f'<p class="heading">{html.escape(page.heading.strip())}</p>')
    body.append("<h2>Ranked plans</h2>")
    if len(table):
        body.append('<p class="note">Click a column header to sort.</p>')
        body.append('<div class="scroll">')
        body.append(
            table_html(
                table,
                table_id="ranked",
                sortable=True,
                text_columns=_text_columns(table),
            )
        )
        body.append("</div>")
    else:
        body.append("<p>no feasible plan</p>")
    body.append("<h2>Search and rejections</h2>")
    body.append(table_html(_search_counts(page.result), table_id="counts", text_columns=["plans"]))
    if page.result.rejection_counts:
        body.append(
            table_html(
                _rejections(page.result),
                table_id="rejections",
                sortable=True,
                text_columns=["reason", "example"],
            )
        )
    body.append(_pre(page.notes))
    body.append("<h2>Step time vs peak memory of the simulated plans</h2>")
    pareto = figs.pareto_plotly(
        page.result.ranked, title=page.title, capacity_bytes=page.capacity_bytes
    )
    body.append(figures.div(pareto, div_id="pareto"))
    if page.best is not None:
        label = page.best.plan.label()
        body.append(f"<h2>Rank 1: {html.escape(label)}</h2>")
        body += _step_sections(
            page.best,
            figures,
            title=f"rank 1: {label}",
            capacity_bytes=page.capacity_bytes,
            shown_note=page.shown_note,
            with_table=True,
        )
    return _page(page.title, body)


def simulate_report_html(page: SimulatePage) -> str:
    """The report of one simulated plan as a self-contained HTML document.

    Sections: the printed report's tables (metrics, where the step goes, memory) and notes,
    the bubble Gantt chart, memory over time and the memory breakdown.

    Args:
        page: what to show (:class:`SimulatePage`).

    Returns:
        The document's text (same inputs, same text).
    """
    figures = _Figures()
    body = [f"<h1>{html.escape(page.title)}</h1>", "<h2>Summary</h2>"]
    for i, (caption, table) in enumerate(page.tables):
        body.append(f"<h3>{html.escape(caption)}</h3>")
        body.append(table_html(table, table_id=f"summary-{i}", text_columns=_text_columns(table)))
    body.append(_pre(page.notes))
    body += _step_sections(
        page.outcome,
        figures,
        title=page.outcome.plan.label(),
        capacity_bytes=page.capacity_bytes,
        shown_note=page.shown_note,
        with_table=False,  # the summary has it
    )
    return _page(page.title, body)


def write_report(path: str | os.PathLike[str], document: str, *, label: str = "--report") -> Path:
    """Write ``document`` (UTF-8) to ``path`` atomically.

    Args:
        path: destination ``.html`` file.
        document: :func:`plan_report_html` or :func:`simulate_report_html`.
        label: what the path came from, named in errors.

    Returns:
        ``path`` as a Path.

    Raises:
        plansim.io.outputs.OutputFileError: the file cannot be written.
    """
    return write_text_atomic(path, document, label=label)
