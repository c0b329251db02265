"""A GPU as a runs table spells it -> the shipped hardware profile it names (pure).

Published runs name GPUs in many ways ("A100-SXM4-80GB", "A100 SXM4 80GB", "H100 SXM5",
"GB200 NVL72", "NVIDIA B200"). :func:`match_profile_name` lower-cases the text, splits it
into tokens at spaces, dashes, underscores and slashes, drops brand words ("nvidia", "amd",
"instinct") and takes the one profile name whose tokens cover all of them, a word token also
covering a longer token it begins ("h100 sxm" -> ``h100-sxm5-80gb``: "sxm" covers "sxm5").
Text that fits several profiles ("a100": 40 and 80 GB) or none ("h100 pcie": no PCIe profile
is shipped; "h100 80gb hbm2e": the PCIe card's memory) is not guessed: the error says which.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from plansim.errors import UnknownNameError

_SPLIT = re.compile(r"[\s_/\-]+")
#: Words that name the vendor or the product line, not the part.
_VENDORS = frozenset({"nvidia", "amd", "instinct"})


def _tokens(text: str) -> frozenset[str]:
    return frozenset(t for t in _SPLIT.split(text.strip().lower()) if t and t not in _VENDORS)


def _covers(name_tokens: frozenset[str], wanted: frozenset[str]) -> bool:
    """Every wanted token is a name token, or a word of 3+ letters that begins one."""
    return all(
        t in name_tokens
        or (t.isalpha() and len(t) >= 3 and any(n.startswith(t) for n in name_tokens))
        for t in wanted
    )


class AmbiguousProfileError(UnknownNameError):
    """Text that several shipped profile names cover (``candidates``)."""

    def __init__(self, text: str, candidates: list[str], known: Iterable[str]) -> None:
        super().__init__(f"hardware profile (ambiguous: {', '.join(candidates)})", text, known)
        self.candidates = candidates


def match_profile_name(text: str, known: Iterable[str]) -> str:
    """The name in ``known`` that ``text`` designates (module docstring).

    Raises:
        UnknownNameError: no name holds every token of ``text``.
        AmbiguousProfileError: more than one does (they are its ``candidates``).
    """
    names = sorted(known)
    wanted = _tokens(text)
    if not wanted:
        raise UnknownNameError("hardware profile", text, names)
    exact = [n for n in names if _tokens(n) == wanted]
    if exact:
        return exact[0]
    fits = [n for n in names if _covers(_tokens(n), wanted)]
    if len(fits) == 1:
        return fits[0]
    if fits:
        raise AmbiguousProfileError(text, fits, names)
    raise UnknownNameError("hardware profile", text, names)
