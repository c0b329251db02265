"""A persistent cache of simulated plans and whole searches, safe against stale entries.

A simulation is a pure function of the model, the hardware profile, the plan and plansim's
own code; so is a search of its arguments. :class:`ResultCache` stores each result under the
SHA-256 of those inputs, the code included as the hash of every source file of the installed
``plansim`` package (:func:`code_version`): any change to the code, to a model or profile
field, or to a plan field gives another key, so an entry is never read for inputs it was not
computed from. Entries are zlib-compressed pickles (a simulated GPT-3 175B plan: about
0.25 MB), written atomically (``outputs.write_bytes_atomic``); an entry that cannot be read
back (cut short, another Python's pickle) counts as a miss and is rewritten. The folder holds
the user's own results: pickles are only read from it, never from elsewhere.

Where: ``--cache-dir DIR`` on ``plansim plan`` and ``plansim sweep``, or the
``PLANSIM_CACHE_DIR`` environment variable; without either nothing is cached. Deleting the
folder (or any file in it) is always safe.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import zlib
from pathlib import Path
from typing import Any

from plansim.errors import InputFileError
from plansim.io.outputs import write_bytes_atomic

#: The environment variable naming the cache folder when ``--cache-dir`` is not given.
CACHE_DIR_ENV = "PLANSIM_CACHE_DIR"


def code_version(package_dir: Path | None = None) -> str:
    """SHA-256 over the relative path and bytes of every ``.py`` file under the plansim
    package (``package_dir``; default: the installed one), in path order."""
    root = package_dir or Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


class ResultCache:
    """Results stored under the hash of their inputs, in ``directory`` (created on first
    write).

    Args:
        directory: the cache folder.
        version: the code version the keys include (default :func:`code_version`; tests
            pass their own).

    Raises:
        InputFileError: ``directory`` exists and is not a folder.
    """

    def __init__(self, directory: str | os.PathLike[str], *, version: str | None = None) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise InputFileError(
                f"cache directory {str(self.directory)!r} exists and is not a folder"
            )
        self.version = version if version is not None else code_version()
        self.hits = 0
        self.misses = 0

    def key(self, kind: str, *inputs: object) -> str:
        """The entry name of a ``kind`` ("simulation", "search") of result for ``inputs``:
        the SHA-256 of the code version, the kind and each input's ``repr`` (frozen
        dataclasses and tuples of numbers and strings: exact and ordered)."""
        digest = hashlib.sha256(self.version.encode("utf-8"))
        for part in (kind, *inputs):
            digest.update(b"\0" + repr(part).encode("utf-8"))
        return f"{kind}-{digest.hexdigest()}"

    def _path(self, key: str) -> Path:
        return self.directory / key[-2:] / f"{key}.pickle.z"

    def get(self, key: str) -> Any | None:
        """The value stored under ``key``, or None (never stored, or unreadable)."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        try:
            value = pickle.loads(zlib.decompress(data))
        except Exception:  # a cut-short or foreign entry: a miss, rewritten by put
            self.misses += 1
            return None
        self.hits += 1
        return value

    def put(self, key: str, value: object) -> None:
        """Store ``value`` under ``key``, atomically.

        Raises:
            OutputFileError: the folder cannot be written (names it and the OS reason).
        """
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = zlib.compress(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), 1)
        write_bytes_atomic(path, data, label="--cache-dir")


def cache_from(directory: str | os.PathLike[str] | None) -> ResultCache | None:
    """The cache a command uses: ``directory`` (``--cache-dir``), else the folder
    :data:`CACHE_DIR_ENV` names, else None (no caching).

    Raises:
        InputFileError: the folder exists and is not a folder.
    """
    chosen = directory if directory is not None else os.environ.get(CACHE_DIR_ENV) or None
    return None if chosen is None else ResultCache(chosen)
