"""plansim command line: ``plansim <command> ...``.

Each subcommand lives in ``plansim/commands/<name>.py`` and exposes
``add_parser(subparsers) -> None``, which registers its parser and sets ``func`` to a callable
``run(args) -> int``. User errors (:class:`plansim.errors.PlansimError`) print one line on
stderr and exit with status 2; there is never a traceback for bad input.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from plansim.calibrate.orphans import LauncherTerminated
from plansim.errors import PlansimError

#: Subcommand modules, in the order ``plansim --help`` lists them.
COMMANDS = (
    "plan", "sweep", "simulate", "export", "backtest", "calibrate", "validate", "models",
    "profiles",
)  # fmt: skip


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in our one-line style (exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"plansim: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The root parser with every available subcommand registered."""
    parser = _Parser(prog="plansim", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version="plansim 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"plansim.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"plansim.commands.{name}":
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``plansim`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except PlansimError as exc:
        print(f"plansim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except LauncherTerminated as exc:  # SIGTERM/SIGHUP while ranks ran: they are stopped
        print(f"plansim: {exc}; the launched ranks were stopped", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("plansim: interrupted", file=sys.stderr)
        return 130
    return status
