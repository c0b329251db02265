"""Write docs/reference/framework-releases.md from plansim's release table (never edited by
hand).

One table per feature of :data:`plansim.planner.framework_releases.FEATURES`: for each
framework it names (``*``: every other one), the first year its runs had the feature, the
release or paper that brought it and the source. Run:

    .venv/bin/python docs/gen/framework_releases.py   # rewrite the page
"""

from __future__ import annotations

import sys
from pathlib import Path

from plansim.planner.framework_releases import ALWAYS, EVERY, FEATURES

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "reference" / "framework-releases.md"

_FRAMEWORKS = {
    "nvidia-megatron": "NVIDIA Megatron (Megatron-LM, Megatron-Core, NeMo, Megatron-Bridge)",
    "nemo": "NeMo, Megatron-Bridge",
    "deepspeed": "anything on DeepSpeed (incl. GPT-NeoX)",
    "deepspeed-pipeline": "DeepSpeed's pipeline engine (Megatron-DeepSpeed, GPT-NeoX)",
    "llm-foundry": "MosaicML llm-foundry / Composer",
    "torchtitan": "torchtitan",
    EVERY: "every other framework",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The page's Markdown."""
    lines = [
        "# What each framework release could run",
        "",
        "`plansim backtest` offers a published run only what its framework had at the run's",
        "date (from the framework cell, e.g. `Megatron-LM (2021)` or `NeMo 24.07`, or the",
        "source locator); an undated run of a known framework is searched as its latest",
        "release, and its note says so. Generated from",
        "`plansim.planner.framework_releases.FEATURES`.",
        "",
    ]
    for feature, entries in FEATURES.items():
        lines += [f"## `{feature}`", "", "| framework | from | release | source |"]
        lines += ["|---|---|---|---|"]
        for tag, since in entries.items():
            year = "always" if since.year == ALWAYS else str(since.year)
            who = "every framework" if len(entries) == 1 else _FRAMEWORKS[tag]
            lines.append(f"| {who} | {year} | {_cell(since.release)} | {_cell(since.source)} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    """Write the page (the test suite checks that the committed one is current)."""
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
