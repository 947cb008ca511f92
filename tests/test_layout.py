"""The repository's shape: things that must stay true for the package to import right."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_operator_folder_is_not_a_python_package() -> None:
    # operator/__init__.py would shadow the standard library's `operator` module.
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_tessera_package_imports_from_src_layout() -> None:
    import tessera

    assert Path(tessera.__file__).resolve().parent == ROOT / "operator" / "src" / "tessera"
    assert tessera.DRIVER_NAME == "gpu.tessera.dev"
