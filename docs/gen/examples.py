"""Write the command outputs the docs show, and the schedule Gantt charts, by running them.

Each example is a ``plansim`` command line; its standard output goes to
``docs/gen/data/examples/NAME.txt``, which pages include (``--8<--``) and README.md shows
between ``<!-- example:NAME:begin -->`` and ``<!-- example:NAME:end -->``. The pipeline
schedules are simulated on one small plan: ``docs/images/schedule-NAME.png``
(``plansim simulate --plot``) and the table ``docs/gen/data/schedules.md`` of their step times
and bubbles (``--format json``), and the plan file ``plan --save-plan`` writes
(``docs/gen/data/examples/plan-file.yaml``). Run:

    .venv/bin/python docs/gen/examples.py            # rewrite every output and picture
    .venv/bin/python docs/gen/examples.py --check    # exit 1 if an output is stale
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "gen" / "data"
EXAMPLES_DIR = DATA / "examples"
SCHEDULES_MD = DATA / "schedules.md"
IMAGES = ROOT / "docs" / "images"
README = ROOT / "README.md"

#: name -> plansim arguments.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "demo": (
        "plan", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024",
        "--gbs", "1536",
    ),
    "simulate-gpt3-2020": (
        "simulate", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024",
        "--tp", "8", "--pp", "16", "--mbs", "1", "--gbs", "1536", "--recompute", "full",
        "--precision", "fp16", "--attention", "unfused", "--no-gradient-accumulation-fusion",
        "--no-scatter-gather-tensors-in-pipeline", "--no-persist-layer-norm",
    ),
    "simulate-sensitivity": (
        "simulate", "--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "64",
        "--tp", "4", "--pp", "4", "--mbs", "1", "--gbs", "512", "--zero", "2",
        "--sequence-parallel", "--schedule", "zb-h1", "--overlap-grad-reduce", "--sensitivity",
    ),
}  # fmt: skip

#: The plan file the plan-file reference shows (``plan --save-plan``).
PLAN_FILE = EXAMPLES_DIR / "plan-file.yaml"
PLAN_FILE_ARGS = (
    "plan", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "8", "--gbs", "64",
    "--top", "1",
)  # fmt: skip

#: The plan every schedule picture simulates (24 layers: 3 per stage with 2 chunks a rank).
SCHEDULE_PLAN = (
    "simulate", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "4",
    "--tp", "1", "--pp", "4", "--mbs", "1", "--gbs", "8",
)  # fmt: skip
#: schedule -> model chunks per rank.
SCHEDULES = {
    "gpipe": 1,
    "1f1b": 1,
    "interleaved-1f1b": 2,
    "zb-h1": 1,
    "zb-v": 2,
    "dualpipev": 2,
    "dualpipe": 1,
}
#: The schedules drawn as pictures (the table lists all).
PICTURES = ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe")


def command_text(args: tuple[str, ...]) -> str:
    """The command line as a user types it."""
    return "plansim " + " ".join(args)


def _plansim(args: tuple[str, ...]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "plansim", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{command_text(args)} exited {done.returncode}:\n{done.stderr}")
    return done.stdout


def example_output(name: str) -> str:
    """What the example prints now."""
    return _plansim(EXAMPLES[name])


def plan_file_text() -> str:
    """The plan file ``plan --save-plan`` writes now."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.yaml"
        _plansim((*PLAN_FILE_ARGS, "--save-plan", str(path)))
        return path.read_text(encoding="utf-8")


def schedule_args(schedule: str) -> tuple[str, ...]:
    return (*SCHEDULE_PLAN, "--vpp", str(SCHEDULES[schedule]), "--schedule", schedule)


def schedules_table() -> str:
    """Step time, bubble and peak memory of the one plan under every schedule."""
    lines = [
        "| schedule | chunks per rank | step time (ms) | bubble | peak memory (GiB) |",
        "|---|---|---|---|---|",
    ]
    for schedule, vpp in SCHEDULES.items():
        doc = json.loads(_plansim((*schedule_args(schedule), "--format", "json")))
        lines.append(
            f"| `{schedule}` | {vpp} | {doc['step_time_s'] * 1e3:.1f} | "
            f"{doc['bubble_fraction'] * 100:.1f}% | {doc['peak_memory_bytes'] / 2**30:.1f} |"
        )
    return "\n".join(lines) + "\n"


def readme_text(readme: str, name: str, output: str) -> str:
    """``readme`` with the example's block (a text fence) replaced by ``output``."""
    begin, end = f"<!-- example:{name}:begin -->", f"<!-- example:{name}:end -->"
    head, sep, rest = readme.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        return readme
    return f"{head}{begin}\n```text\n{output.rstrip()}\n```\n{end}{tail}"


def write_all() -> None:
    EXAMPLES_DIR.mkdir(parents=True, exist_ok=True)
    readme = README.read_text(encoding="utf-8")
    for name in EXAMPLES:
        output = example_output(name)
        (EXAMPLES_DIR / f"{name}.txt").write_text(output, encoding="utf-8")
        readme = readme_text(readme, name, output)
        print(f"wrote {(EXAMPLES_DIR / f'{name}.txt').relative_to(ROOT)}")
    README.write_text(readme, encoding="utf-8")
    PLAN_FILE.write_text(plan_file_text(), encoding="utf-8")
    SCHEDULES_MD.write_text(schedules_table(), encoding="utf-8")
    IMAGES.mkdir(parents=True, exist_ok=True)
    for schedule in PICTURES:
        path = IMAGES / f"schedule-{schedule}.png"
        _plansim((*schedule_args(schedule), "--plot", str(path)))
        print(f"wrote {path.relative_to(ROOT)}")


def stale() -> list[str]:
    """The outputs that differ from what the commands print now."""
    found = []
    readme = README.read_text(encoding="utf-8")
    for name in EXAMPLES:
        path = EXAMPLES_DIR / f"{name}.txt"
        output = example_output(name)
        if not path.exists() or path.read_text(encoding="utf-8") != output:
            found.append(str(path.relative_to(ROOT)))
        if readme_text(readme, name, output) != readme:
            found.append(f"README.md (example {name})")
    if PLAN_FILE.read_text(encoding="utf-8") != plan_file_text():
        found.append(str(PLAN_FILE.relative_to(ROOT)))
    if SCHEDULES_MD.read_text(encoding="utf-8") != schedules_table():
        found.append(str(SCHEDULES_MD.relative_to(ROOT)))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        for name in found:
            print(f"{name} is stale: run docs/gen/examples.py")
        return 1 if found else 0
    write_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
