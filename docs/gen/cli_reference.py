"""Write docs/reference/cli.md from plansim's argparse parser (never edited by hand).

Walks :func:`plansim.cli.build_parser`, every subcommand and every nested subcommand
(``plansim profiles import-nccl-tests``), and writes one section per command: its
description, a usage line and one row per option with its argument, default and help, in
the order ``--help`` lists them. The output does not depend on the terminal width. Run:

    .venv/bin/python docs/gen/cli_reference.py          # rewrite docs/reference/cli.md
    .venv/bin/python docs/gen/cli_reference.py --check  # exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from plansim.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "reference" / "cli.md"

_CODE_SPAN = re.compile(r"(``.+?``|`[^`]+`)")


def _escape(text: str) -> str:
    """Markdown-safe text: code spans kept as they are (RST ``x`` becomes `x`); outside
    them, characters Markdown or HTML would read as syntax are escaped."""
    parts = []
    for i, piece in enumerate(_CODE_SPAN.split(text)):
        if i % 2:  # a code span
            parts.append("`" + piece.strip("`") + "`")
            continue
        for char, repl in (
            ("\\", "\\\\"),
            ("&", "&amp;"),
            ("<", "&lt;"),
            (">", "&gt;"),
            ("*", "\\*"),
            ("_", "\\_"),
            ("[", "\\["),
            ("]", "\\]"),
            ("#", "\\#"),
        ):
            piece = piece.replace(char, repl)
        parts.append(piece)
    return "".join(parts).replace("|", "\\|").replace("\n", " ")


def _help(action: argparse.Action, prog: str) -> str:
    """The action's help with argparse's ``%(default)s``-style fields filled in."""
    text = action.help or ""
    if "%" in text:
        params = dict(vars(action), prog=prog)
        params = {k: getattr(v, "__name__", v) for k, v in params.items()}
        text = text % params
    return " ".join(text.split())


def _argument(action: argparse.Action) -> str:
    """What follows the flag: its metavar, its choices or nothing."""
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        name = (
            " ".join(action.metavar) if isinstance(action.metavar, tuple) else str(action.metavar)
        )
    elif action.choices is not None:
        name = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        name = action.dest.upper()
    if action.nargs in ("*", "+"):
        name += " ..."
    elif action.nargs == "?":
        name = f"[{name}]"
    return name


def _default(action: argparse.Action) -> str:
    """The default as ``--help`` would show it (blank for flags, None and suppressed), or
    *required*."""
    if action.required and action.option_strings:
        return "*required*"
    value = action.default
    if action.nargs == 0 or value is None or value == argparse.SUPPRESS:
        return ""
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    return f"`{value}`"


def _usage(parser: argparse.ArgumentParser) -> str:
    """One usage line: positionals by name, options shown as ``[OPTIONS]``."""
    words = [parser.prog]
    if any(a.option_strings for a in parser._actions if not _hidden(a)):
        words.append("[OPTIONS]")
    for action in parser._actions:
        if action.option_strings or _hidden(action):
            continue
        if isinstance(action, argparse._SubParsersAction):
            words.append((action.metavar or "COMMAND") + " ...")
        else:
            words.append(_argument(action) or action.dest.upper())
    return " ".join(words)


def _hidden(action: argparse.Action) -> bool:
    return action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Subcommand name -> its one-line help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def _anchor(prog: str) -> str:
    return prog.replace(" ", "-")


def _section(parser: argparse.ArgumentParser, level: int, summary: str) -> list[str]:
    """The Markdown of one command (and, after it, of its subcommands)."""
    prog = parser.prog
    lines = [f"{'#' * level} `{prog}` {{ #{_anchor(prog)} }}", ""]
    text = parser.description or summary
    if text:
        lines += [_escape(" ".join(text.split())), ""]
    lines += ["```text", _usage(parser), "```", ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not _hidden(a)]
        actions = [a for a in actions if not isinstance(a, argparse._SubParsersAction)]
        if not actions:
            continue
        title = group.title or "options"
        lines += [f"**{_escape(title)}**", ""]
        lines += ["| option | argument | default | description |", "|---|---|---|---|"]
        for action in actions:
            flags = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
            arg = _argument(action)
            arg_cell = f"`{arg}`" if arg else ""
            help_text = _escape(_help(action, prog))
            lines.append(f"| {flags} | {arg_cell} | {_default(action)} | {help_text} |")
        lines.append("")
    subs = _subcommands(parser)
    summaries = _summaries(parser)
    if subs and level > 1:
        lines += ["| command | what it does |", "|---|---|"]
        for name, sub in subs:
            lines.append(f"| [`{name}`](#{_anchor(sub.prog)}) | {_escape(summaries[name])} |")
        lines.append("")
    for name, sub in subs:
        lines += _section(sub, level + 1, summaries.get(name, ""))
    return lines


def render() -> str:
    """The whole page."""
    parser = build_parser()
    summaries = _summaries(parser)
    lines = [
        "# CLI reference",
        "",
        "<!-- Generated by docs/gen/cli_reference.py from plansim's argparse parser; "
        "do not edit. -->",
        "",
        "Every command and option as `plansim COMMAND --help` lists them. Bad input gets one "
        "line naming the field and the allowed values and exit status 2. `--model` takes a "
        "preset (`plansim models`) or a Hugging Face `config.json`; `--gpu` (alias "
        "`--profile`) a profile name (`plansim profiles list`) or a profile YAML. What the "
        "options do and how they combine: [commands in depth](../cli.md).",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for name, sub in _subcommands(parser):
        lines.append(f"| [`plansim {name}`](#{_anchor(sub.prog)}) | {_escape(summaries[name])} |")
    lines.append("")
    for name, sub in _subcommands(parser):
        lines += _section(sub, 2, summaries[name])
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with ``--check`` say whether the committed one is current."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run {Path(__file__).relative_to(ROOT)}")
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
