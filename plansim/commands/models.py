"""``plansim models``: list the model presets, or show one model's parameter breakdown.

``plansim models`` prints one row per preset (name, parameters in billions, layers, hidden,
heads, KV heads, FFN, activation, seq, vocab). ``plansim models NAME_OR_CONFIG`` prints the
same row for one preset or local Hugging Face ``config.json`` followed by its parameter
breakdown by component.

Models with routed experts (``plansim models --moe`` lists those presets) show their total
and active parameters, the breakdown by layer kind and the forward FLOPs per token
(``plansim.analytic.moe_counts``), and a note that plansim does not yet plan or simulate
them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from plansim.analytic.flops import model_flops_per_token
from plansim.analytic.moe_counts import (
    FWD_BWD_MULTIPLIER,
    count_moe_parameters,
    forward_flops_per_token,
)
from plansim.analytic.params import count_parameters
from plansim.catalog import moe_preset_names, preset_names, resolve_model
from plansim.errors import SpecError
from plansim.specs.model import ModelSpec, dense_only_reason

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

#: Columns of the row of a model with experts (MLA, MTP modules).
MOE_HEADER = (
    "name",
    "total_b",
    "active_b",
    "layers",
    "moe_layers",
    "experts",
    "top_k",
    "shared",
    "expert_ffn",
    "attention",
    "hidden",
    "heads",
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
    parser.add_argument(
        "--moe",
        action="store_true",
        help="list the presets with routed experts (described: parameters and FLOPs; not yet "
        "planned or simulated)",
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


def _attention_kind(model: ModelSpec) -> str:
    if model.mla is not None:
        return "mla"
    return "mha" if model.num_query_groups == model.num_attention_heads else "gqa"


def moe_model_row(model: ModelSpec) -> tuple[str, ...]:
    """One table row describing a model with experts (columns of MOE_HEADER; a model
    without experts shows 0 experts)."""
    counts = count_moe_parameters(model)
    moe = model.moe
    return (
        model.name,
        f"{counts.total / 1e9:.2f}",
        f"{counts.active / 1e9:.2f}",
        str(model.num_layers),
        str(counts.num_moe_layers),
        str(moe.num_experts if moe else 0),
        str(moe.top_k if moe else 0),
        str(moe.num_shared_experts if moe else 0),
        str(moe.expert_ffn_hidden_size if moe else 0),
        _attention_kind(model),
        str(model.hidden_size),
        str(model.num_attention_heads),
        str(model.seq_length),
        str(model.vocab_size),
    )


def _detail(model: ModelSpec) -> str:
    counts = count_parameters(model).as_dict()
    rows = [(path, f"{value:,d}") for path, value in counts.items()]
    rows.append(("model_flops_per_token", f"{model_flops_per_token(model):.4g}"))
    return "\n\n".join(
        (format_table(HEADER, [model_row(model)]), format_table(("component", "value"), rows))
    )


def _moe_detail(model: ModelSpec) -> str:
    """Row, parameter breakdown by layer kind and forward FLOPs per token."""
    rows = [(path, f"{value:,d}") for path, value in count_moe_parameters(model).as_dict().items()]
    forward = forward_flops_per_token(model)
    rows += [(path, f"{value:.4g}") for path, value in forward.as_dict().items()]
    rows.append(("model_flops_per_token", f"{FWD_BWD_MULTIPLIER * forward.total:.4g}"))
    table = format_table(("component", "value"), rows)
    return f"{format_table(MOE_HEADER, [moe_model_row(model)])}\n\n{table}"


def run(args: argparse.Namespace) -> int:
    """Print the preset table, or one model's breakdown; 0 on success.

    Raises:
        SpecError: ``--moe`` given with a model.
    """
    if args.moe:
        if args.model is not None:
            raise SpecError(
                f"--moe lists the presets with experts; give no model (got {args.model!r})"
            )
        names = moe_preset_names()
        models = [resolve_model(name, seq_length=args.seq_length) for name in names]
        print(format_table(MOE_HEADER, [moe_model_row(m) for m in models]))
        return 0
    if args.model is None:
        models = [resolve_model(name, seq_length=args.seq_length) for name in preset_names()]
        print(format_table(HEADER, [model_row(m) for m in models]))
        return 0
    model = resolve_model(args.model, seq_length=args.seq_length)
    print(_detail(model) if dense_only_reason(model) is None else _moe_detail(model))
    return 0
