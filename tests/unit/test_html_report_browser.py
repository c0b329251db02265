"""The plan report in headless Chromium: every script runs without an error (the page's own
recorder would list it), the ranked table is there and sorts on a header click, and Plotly
draws each figure. Skipped, with the reason, where no Chromium is installed
(``make install-browser`` installs Debian's)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from plansim.cli import main
from plansim.report.html_report import ERROR_RECORDER, ERRORS_ID
from tests.unit.test_html_report import PLAN, table_header, table_rows

FIGURES = ("pareto", "gantt", "memory", "memory-breakdown")
#: Flags of a quiet, offline headless run (no first-run UI, no background fetches).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=5000",
)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        "no chromium binary on PATH (chromium, chromium-browser or google-chrome; "
        "'make install-browser' installs Debian's): the HTML report is not opened in a browser"
    )


def _run(browser: str, page: Path, profile: Path, *extra: str) -> str:
    """Chromium's output (the DOM with ``--dump-dom``) for ``page``."""
    argv = [browser, *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _errors(dom: str) -> str:
    match = re.search(rf'<pre id="{ERRORS_ID}"[^>]*>(.*?)</pre>', dom, re.S)
    assert match, "the error recorder's element is missing"
    return match.group(1)


@pytest.fixture(scope="module")
def browser() -> str:
    return _chromium()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "plan.html"
    assert main([*PLAN, "--format", "csv", "--report", str(path)]) == 0
    return path


def test_report_renders_without_script_errors(browser: str, report: Path, tmp_path: Path) -> None:
    dom = _run(browser, report, tmp_path / "profile", "--dump-dom")
    assert _errors(dom) == ""
    table = re.search(r'<table id="ranked" class="sortable">.*?</table>', dom, re.S)
    assert table and len(re.findall(r"<tr>", table.group(0))) == 4  # header and 3 plans
    for div_id in FIGURES:
        opening = re.search(rf'<div id="{div_id}" class="([^"]*)"', dom)
        assert opening and "js-plotly-plot" in opening.group(1), f"{div_id} was not plotted"
        drawn = dom[opening.end() : opening.end() + 4000]
        assert 'class="plot-container plotly"' in drawn and 'class="main-svg"' in drawn


def test_ranked_table_sorts_on_a_header_click(browser: str, report: Path, tmp_path: Path) -> None:
    """Click the peak-memory header once (ascending) and again (descending); a probe script
    added to a copy of the page writes the rank column after each click."""
    probe = """<script>
(function () {
  var table = document.getElementById("ranked");
  var heads = Array.prototype.slice.call(table.querySelectorAll("thead th"));
  var head = heads.filter(function (h) { return h.textContent === "peak_mem_gib"; })[0];
  function column(name) {
    var i = heads.map(function (h) { return h.textContent; }).indexOf(name);
    return Array.prototype.map.call(table.tBodies[0].rows, function (r) {
      return r.cells[i].textContent; }).join(",");
  }
  var out = [];
  head.click(); out.push(column("peak_mem_gib") + ";" + column("rank"));
  head.click(); out.push(column("peak_mem_gib") + ";" + column("rank"));
  var pre = document.createElement("pre"); pre.id = "sort-probe";
  pre.textContent = out.join("|"); document.body.appendChild(pre);
})();
</script></body>"""
    copy = tmp_path / "probe.html"
    copy.write_text(report.read_text(encoding="utf-8").replace("</body>", probe), "utf-8")
    dom = _run(browser, copy, tmp_path / "profile", "--dump-dom")
    assert _errors(dom) == ""
    found = re.search(r'<pre id="sort-probe">(.*?)</pre>', dom)
    assert found, "the probe did not run"
    rows = table_rows(report.read_text(encoding="utf-8"), "ranked")
    header = table_header(report.read_text(encoding="utf-8"), "ranked")
    peak, rank = header.index("peak_mem_gib"), header.index("rank")
    pairs = sorted((float(r[peak]), r[rank]) for r in rows)
    for click, order in zip(found.group(1).split("|"), (1, -1), strict=True):
        peaks, ranks = (part.split(",") for part in click.split(";"))
        values = [float(v) for v in peaks]
        assert values == sorted(values, reverse=order < 0)
        assert sorted(zip(values, ranks, strict=True)) == pairs  # whole rows move


def test_a_script_error_is_detected(browser: str, tmp_path: Path) -> None:
    """The recorder the report carries does catch an error: the check above can fail."""
    page = tmp_path / "broken.html"
    page.write_text(
        f"<!DOCTYPE html><html><head>{ERROR_RECORDER}</head><body>"
        f'<pre id="{ERRORS_ID}" hidden></pre>'
        "<script>notAFunction();</script></body></html>",
        encoding="utf-8",
    )
    dom = _run(browser, page, tmp_path / "profile", "--dump-dom")
    assert "notAFunction is not defined" in _errors(dom)


def test_report_screenshot(browser: str, report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    _run(browser, report, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,1000")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
