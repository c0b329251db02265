"""``plansim models``: list the model presets, or show one model's parameter breakdown.

``plansim models`` prints one row per preset (name, parameters in billions, layers, hidden,
heads, KV heads, FFN, activation, seq, vocab). ``plansim models NAME_OR_CONFIG`` prints the
same row for one preset or local Hugging Face ``config.json`` followed by its parameter
breakdown by component.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from plansim.analytic.flops import model_flops_per_token
from plansim.analytic.params import count_parameters
from plansim.catalog import preset_names, resolve_model
from plansim.specs.model import ModelSpec

HEADER = (
    "name",
    "params_b",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn",
    "activation",
    "seq",
    "vocab",
)


def add_parser(subparsers: Any) -> None:
    """Register ``models`` on the root parser's subparsers."""
    parser = subparsers.add_parser(
        "models",
        help="list model presets, or show one model's parameter breakdown",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument(
        "model",
        nargs="?",
        metavar="NAME_OR_CONFIG",
        help="a preset name or a path to a Hugging Face config.json (default: list all presets)",
    )
    parser.add_argument(
        "--seq-length", type=int, default=None, help="override the sequence length in tokens"
    )
    parser.set_defaults(func=run)


def model_row(model: ModelSpec) -> tuple[str, ...]:
    """One table row describing ``model`` (columns of HEADER)."""
    params_b = count_parameters(model).total / 1e9
    return (
        model.name,
        f"{params_b:.2f}",
        str(model.num_layers),
        str(model.hidden_size),
        str(model.num_attention_heads),
        str(model.num_query_groups),
        str(model.ffn_hidden_size),
        model.activation.value,
        str(model.seq_length),
        str(model.vocab_size),
    )


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Fixed-width text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join((first, *rest)).rstrip()

    return "\n".join(line(r) for r in (header, *rows))


def _detail(model: ModelSpec) -> str:
    counts = count_parameters(model).as_dict()
    rows = [(path, f"{value:,d}") for path, value in counts.items()]
    rows.append(("model_flops_per_token", f"{model_flops_per_token(model):.4g}"))
    return "\n\n".join(
        (format_table(HEADER, [model_row(model)]), format_table(("component", "value"), rows))
    )


def run(args: argparse.Namespace) -> int:
    """Print the preset table, or one model's breakdown; 0 on success."""
    if args.model is None:
        models = [resolve_model(name, seq_length=args.seq_length) for name in preset_names()]
        print(format_table(HEADER, [model_row(m) for m in models]))
        return 0
    print(_detail(resolve_model(args.model, seq_length=args.seq_length)))
    return 0
