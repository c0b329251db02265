"""--report FILE.html of plansim plan and plansim simulate: one self-contained page with the
ranked table, the rejections and the Plotly figures; same inputs, same bytes; a bad path is
one clear error line."""

from __future__ import annotations

import csv
import html
import json
import re
from pathlib import Path

import pytest

from plansim.cli import main

#: A plan search of a few seconds: two pipeline ranks, interleaved schedules among the top,
#: plans rejected for memory.
PLAN = [
    "plan",
    "--model",
    "llama3-8b",
    "--gpu",
    "a100-sxm4-40gb",
    "--gpus",
    "8",
    "--gbs",
    "16",
    "--tp",
    "2",
    "--pp",
    "2",
    "--top",
    "3",
    "--simulate-top",
    "4",
    "--jobs",
    "1",
]
#: One plan of four pipeline ranks, 16 micro-batches.
SIM = [
    "simulate",
    "--model",
    "megatron-1.7b",
    "--gpu",
    "a100-sxm4-80gb",
    "--gpus",
    "16",
    "--tp",
    "2",
    "--pp",
    "4",
    "--mbs",
    "2",
    "--gbs",
    "64",
]
FIGURES = ("gantt", "memory", "memory-breakdown")


def table_rows(page: str, table_id: str) -> list[list[str]]:
    """The body cells of the table ``table_id``, unescaped."""
    match = re.search(rf'<table id="{table_id}"[^>]*>.*?<tbody>(.*?)</tbody>', page, re.S)
    assert match, f"no table {table_id}"
    return [
        [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", match.group(1), re.S)
    ]


def table_header(page: str, table_id: str) -> list[str]:
    match = re.search(rf'<table id="{table_id}"[^>]*><thead><tr>(.*?)</tr>', page, re.S)
    assert match, f"no table {table_id}"
    return [html.unescape(c) for c in re.findall(r"<th[^>]*>(.*?)</th>", match.group(1))]


def _assert_self_contained(page: str, div_ids: tuple[str, ...]) -> None:
    """One inlined Plotly bundle, no script loaded from anywhere, a plotted div per figure."""
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>\n")
    assert page.count("plotly.js v") == 1  # the bundle's banner: inlined once
    assert not re.search(r"<script[^>]*\ssrc=", page), "a script is loaded from a URL"
    assert not re.search(r'<link[^>]*href="http', page)
    for div_id in div_ids:
        assert f'<div id="{div_id}" class="plotly-graph-div"' in page
        assert re.search(rf'Plotly\.newPlot\(\s*"{div_id}",', page), f"{div_id} is not plotted"
    assert '<pre id="report-errors" hidden></pre>' in page


def test_plan_report_has_the_table_rejections_and_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "one.html", tmp_path / "two.html"
    assert main([*PLAN, "--format", "csv", "--report", str(first)]) == 0
    printed = capsys.readouterr()
    assert f"plansim: wrote --report {first}" in printed.err
    rows = list(csv.DictReader(printed.out.splitlines()))
    assert len(rows) == 3
    page = first.read_text(encoding="utf-8")
    _assert_self_contained(page, ("pareto", *FIGURES))
    header = table_header(page, "ranked")
    assert header == [*rows[0].keys(), "plan"]
    shown = table_rows(page, "ranked")
    assert [cells[:-1] for cells in shown] == [list(r.values()) for r in rows]
    for cells, row in zip(shown, rows, strict=True):
        assert cells[-1].startswith(f"tp{row['tp']} pp{row['pp']} dp{row['dp']} ")
    assert f"Rank 1: {html.escape(shown[0][-1])}</h2>" in page
    assert 'class="sortable"' in page and "aria-sort" in page
    # the rejections with their counts, as the table form prints them
    assert main(PLAN) == 0
    text = capsys.readouterr().out
    rejections = table_rows(page, "rejections")
    assert rejections, "no rejection listed"
    for count, reason, example in rejections:
        assert f"{int(count):6d}  {reason}, e.g. {example}" in text
    counts = dict(table_rows(page, "counts"))
    assert f"{counts['candidates']} candidates: {counts['feasible']} feasible" in text
    # same inputs, same bytes
    assert main([*PLAN, "--format", "csv", "--report", str(second)]) == 0
    capsys.readouterr()
    assert second.read_bytes() == first.read_bytes()


def test_plan_report_leaves_what_is_printed_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(PLAN) == 0
    plain = capsys.readouterr()
    assert main([*PLAN, "--report", str(tmp_path / "r.html")]) == 0
    reported = capsys.readouterr()
    assert reported.out == plain.out
    assert reported.err == plain.err + f"plansim: wrote --report {tmp_path / 'r.html'}\n"


def test_simulate_report_has_the_summary_and_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "one.html", tmp_path / "two.html"
    assert main([*SIM, "--format", "json", "--report", str(first)]) == 0
    doc = json.loads(capsys.readouterr().out)
    page = first.read_text(encoding="utf-8")
    _assert_self_contained(page, FIGURES)
    assert "<h1>megatron-1.7b on 16 x a100-sxm4-80gb: tp2 pp4 dp2 mbs2 zero0 none 1f1b</h1>" in page
    metrics = dict(table_rows(page, "summary-0"))
    assert metrics["step_time_s"] == str(round(doc["step_time_s"], 3))
    assert metrics["peak_mem_gib"] == str(round(doc["peak_memory_bytes"] / 2**30, 1))
    memory = dict(table_rows(page, "summary-2"))
    for component, num_bytes in doc["memory_breakdown_bytes"].items():
        if component != "rank":
            assert memory[component] == str(round(num_bytes / 2**30, 2))
    assert "one layer, one micro-batch: forward" in page
    assert main([*SIM, "--report", str(second)]) == 0
    capsys.readouterr()
    assert second.read_bytes() == first.read_bytes()


def test_simulate_report_of_a_long_step_shows_its_steady_state_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As --trace and --plot: a step of many micro-batches shows the window of the shorter
    step its figures come from, so the page does not grow with the micro-batch count."""
    base = [*SIM[:5], "--gpus", "4", "--tp", "1", "--pp", "4", "--mbs", "1"]
    sizes = {}
    for gbs in (512, 1024):
        path = tmp_path / f"gbs{gbs}.html"
        assert main([*base, "--gbs", str(gbs), "--report", str(path)]) == 0
        err = capsys.readouterr().err
        assert f"plansim: the outputs show micro-batches 0-127 of {gbs}" in err
        page = path.read_text(encoding="utf-8")
        assert f"micro-batches 0-127 of {gbs} shown" in page and "--whole-step for all" in page
        sizes[gbs] = len(page)
    assert abs(sizes[1024] - sizes[512]) < 0.01 * sizes[512]
    whole = tmp_path / "whole.html"
    assert main([*base, "--gbs", "512", "--whole-step", "--report", str(whole)]) == 0
    capsys.readouterr()
    assert "of 512 shown" not in whole.read_text(encoding="utf-8")
    assert whole.stat().st_size > sizes[512]


@pytest.mark.parametrize("argv", [PLAN, SIM], ids=["plan", "simulate"])
def test_report_in_a_missing_folder_is_one_clear_error(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "no" / "such" / "report.html"
    assert main([*argv, "--report", str(path)]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith(f"plansim: error: --report: cannot write '{path}': directory ")
    assert "does not exist" in err and err.count("\n") == 1 and "Traceback" not in err
    assert captured.out == ""  # refused before any search or simulation
    assert not path.parent.exists()


def test_plan_report_needs_one_gpu_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*PLAN[:5], "--gpus", "8:16", *PLAN[7:], "--tokens", "1e9"]
    assert main([*argv, "--report", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "--report shows one search: give one --gpus count" in err and err.count("\n") == 1
