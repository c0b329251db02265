"""Atomic writers for output files (traces, plots): the whole file appears at once or not at all.

Each writer puts the bytes in a temporary file in the destination's folder, then
``os.replace`` s it over the destination (atomic on POSIX within one file system), so a reader
never sees half a file and an interrupted run leaves the previous file in place. The
temporary file is created with mode 0o666 minus the umask, like an ordinary ``open``.

Failures are :class:`OutputFileError` (a :class:`plansim.errors.PlansimError`: the CLI prints
it on one line, exit 2) naming the option the path came from (``label``) and the path.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any

from plansim.errors import PlansimError


class OutputFileError(PlansimError):
    """An output file cannot be written; the message names the option and the path."""


def _fail(label: str, path: Path, why: str) -> OutputFileError:
    return OutputFileError(f"{label}: cannot write {str(path)!r}: {why}")


def check_writable(path: str | os.PathLike[str], *, label: str) -> Path:
    """Check, before any long work, that ``path`` can be created or replaced.

    Args:
        path: the output file.
        label: what the path came from, e.g. ``"--plot"`` (used in the message).

    Returns:
        ``path`` as a Path.

    Raises:
        OutputFileError: the folder is missing, is not a folder or not writable, or the path
            is a folder.
    """
    out = Path(path)
    parent = out.parent
    if out.is_dir():
        raise _fail(label, out, "it is a directory")
    if not parent.exists():
        raise _fail(label, out, f"directory {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise _fail(label, out, f"{str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _fail(label, out, f"directory {str(parent)!r} is not writable")
    return out


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, label: str) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file in the same folder + os.replace).

    Args:
        path: destination file.
        data: the complete file content.
        label: what the path came from, e.g. ``"--trace"`` (used in error messages).

    Returns:
        ``path`` as a Path.

    Raises:
        OutputFileError: the file cannot be written (the OS reason is in the message).
    """
    out = check_writable(path, label=label)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _fail(label, out, exc.strerror or str(exc)) from exc
    return out


def write_text_atomic(path: str | os.PathLike[str], text: str, *, label: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`write_bytes_atomic`."""
    return write_bytes_atomic(path, text.encode("utf-8"), label=label)


def write_json_atomic(path: str | os.PathLike[str], doc: Any, *, label: str) -> Path:
    """Write ``doc`` as compact JSON with sorted keys and a final newline, atomically.

    Same input, same bytes. NaN and infinities are refused (they are not JSON).

    Raises:
        OutputFileError: the file cannot be written.
        ValueError: ``doc`` holds NaN or infinity (a bug in the caller, not user input).
    """
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return write_text_atomic(path, text + "\n", label=label)


def _new_file_mode(target: Path) -> int:
    """Permissions for a replacement of ``target``: its own, or 0o666 less the umask (mkstemp
    alone would leave 0o600)."""
    if target.exists():
        return stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def replace_file(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) durably and atomically, for data files that other
    runs build on (profiles, raw measurements): a temporary file in the same folder with the
    target's permissions, flushed to disk, then ``os.replace``; on any failure the previous
    file is left untouched and the temporary file removed.

    Raises:
        OSError: the file cannot be written (the caller names the option it came from).
    """
    target = Path(path)
    mode = _new_file_mode(target)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    done = False
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
        done = True
    finally:
        if not done:
            Path(tmp_name).unlink(missing_ok=True)
