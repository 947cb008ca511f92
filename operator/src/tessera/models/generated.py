"""Files the code generates and the repository keeps (``crds/``, ``manifests/``, the chart's
generated parts): which differ from what the code makes now, writing them, and saying which
are out of date. Shared by the three generators' ``--write`` / ``--check`` commands
(``tessera.models.crd``, ``tessera.manifests``, ``tessera.chart``).
Not for: making the files' contents (each generator does that).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path


def differing(folder: Path, files: Mapping[str, str]) -> list[str]:
    """The names in ``files`` whose file under ``folder`` is missing or holds other text."""
    return [
        name for name, text in files.items() if not (folder / name).is_file() or (folder / name).read_text() != text
    ]


def report_stale(folder: Path, stale: Iterable[str], regenerate: str) -> int:
    """Print one line per stale file with the command that regenerates it; 1 when any, else 0."""
    names = list(stale)
    for name in names:
        print(f"{folder / name} is out of date: run {regenerate}")
    return 1 if names else 0


def write_files(folder: Path, files: Mapping[str, str]) -> int:
    """Write every file under ``folder``, making folders as needed; 0."""
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0
