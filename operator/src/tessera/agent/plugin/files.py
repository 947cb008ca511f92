"""Atomic file writes for the plugin's state on disk (CDI specs, the checkpoint).

A reader (the container runtime's CDI cache, a restarted agent) sees the old file or the new
one, never half of one: write a temporary file in the same folder, flush it to disk, rename
it over the target, then flush the folder so the rename itself survives a power cut. Files
rebuilt from a durable record (CDI specs, from the checkpoint) skip both flushes.
Temporary names start with a dot and end in ``.tmp``, which the CDI cache ignores.
Not for: deciding what to write.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` in one step; creates the folder when missing. With
    ``durable=False`` nothing is synced: readers still see the old file or the new one, but a
    crash of the machine may lose the change (or leave the file empty), so only files that are
    rebuilt from a durable record may be written so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if durable:
        _sync_folder(path.parent)


def remove_durably(path: Path) -> bool:
    """Remove ``path``; False when it was already gone."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    _sync_folder(path.parent)
    return True


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
