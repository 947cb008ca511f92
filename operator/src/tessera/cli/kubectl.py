"""``kubectl tessera``: the kubectl plugin, installed as the ``kubectl-tessera`` command.

kubectl runs any executable named ``kubectl-<name>`` on PATH as ``kubectl <name>``, passing the
words after the name and its own environment (``KUBECONFIG``; kubectl's own flags such as
``--context`` are not passed on). Offered: ``kubectl tessera plan`` (preview policies, offline
or ``--live``) and ``kubectl tessera status`` (per node and GPU: layout, devices, holders).
Not for: running the operator, the agent or a local cluster (``tessera``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tessera.cli import main as tessera_main

PLUGIN_COMMANDS = ("plan", "status")


def main(argv: Sequence[str] | None = None) -> int:
    return tessera_main(argv, prog="kubectl tessera", only=PLUGIN_COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
