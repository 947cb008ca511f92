"""Regenerate the committed ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` modules from the
.proto files beside this module, with grpcio-tools (a dev dependency).

Run ``python -m tessera.agent.plugin.proto.codegen`` after editing a .proto file; the drift
test calls ``generate`` into a temporary folder and compares byte for byte.
Not for: runtime use; nothing in the agent imports this module.
"""

from __future__ import annotations

import sys
import tempfile
from importlib import resources
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PROTO_DIR.parents[3]  # the folder that holds the ``tessera`` package
PACKAGE_PATH = PROTO_DIR.relative_to(SOURCE_ROOT)

# Generated code is checked by the drift test, not by our linters; mypy still reads the .pyi
# stubs for the messages' types but reports nothing inside generated files.
_HEADER = "# ruff: noqa\n# mypy: ignore-errors\n"


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def _mark_generated(path: Path) -> None:
    path.write_text(_HEADER + path.read_text())


def generate(out_dir: Path) -> list[Path]:
    """Generate the modules for every .proto file into ``out_dir`` (flat); returns their paths."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # dev-only, ships no types

    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{SOURCE_ROOT}",
            f"-I{resources.files('grpc_tools') / '_proto'}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(p.relative_to(SOURCE_ROOT)) for p in proto_files()),
        ]
        code = protoc.main(args)
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for produced in sorted((Path(tmp) / PACKAGE_PATH).iterdir()):
            target = out_dir / produced.name
            target.write_bytes(produced.read_bytes())
            _mark_generated(target)
            written.append(target)
    return written


def main() -> int:
    for path in generate(PROTO_DIR):
        print(path.relative_to(SOURCE_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
