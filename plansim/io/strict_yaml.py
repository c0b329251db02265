"""Strict YAML reading for plansim's input files (profiles, plan files): PyYAML's safe
loader (in C where libyaml is installed) that also refuses duplicate mapping keys and
aliases.

``yaml.safe_load`` keeps the last of two equal keys without a word (a profile giving
``hbm_bandwidth_gb_per_s`` twice would silently take the second) and expands aliases, so a
small file of nested aliases (a "billion laughs" document) grows without bound. No plansim
file needs either; both are a :class:`StrictYamlError` (a ``yaml.YAMLError``) naming the
key or the alias and its line.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

_BASE: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictYamlError(yaml.constructor.ConstructorError):
    """A duplicate key or an alias in a plansim input file."""


class _StrictLoader(_BASE):  # type: ignore[misc]
    """The safe loader, refusing duplicate keys and aliases (each node constructed once)."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        if node in self.constructed_objects or node in self.recursive_objects:
            raise StrictYamlError(
                None,
                None,
                "an alias (*name) repeats an anchored value; plansim files take no aliases: "
                "write the value out",
                node.start_mark,
            )
        return super().construct_object(node, deep=deep)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode):
                continue  # a non-scalar key: the safe constructor refuses it
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise StrictYamlError(
                    None,
                    None,
                    f"duplicate key {key_node.value!r} (a key may appear once in a mapping)",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def strict_load(text: str) -> Any:
    """The document of ``text`` as ``yaml.safe_load`` gives it, refusing duplicate keys and
    aliases.

    Raises:
        yaml.YAMLError: the text is not YAML; StrictYamlError for a duplicate key or an
            alias (with its line).
    """
    return yaml.load(text, Loader=_StrictLoader)
