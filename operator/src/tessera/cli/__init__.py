"""The ``tessera`` command: one entry point, one subcommand per job.

Each subcommand lives in its own module and registers itself in ``SUBCOMMANDS``; this module
only parses the first word and imports that subcommand's module alone, so ``tessera agent``
never loads what only the operator or the local cluster needs, nor (``LEFT_OUT``) the optional
libraries a dependency would load that the subcommand has no use for. Not for: any of the jobs
themselves.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Each module has `add_arguments(parser)` and `run(args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("tessera.cli.cluster", "build and start the local Kubernetes control plane"),
    "plan": ("tessera.cli.plan", "preview the GPU layouts SharingPolicies would give an inventory of nodes"),
    "operator": ("tessera.cli.operator", "run the operator: SharingPolicies into NodeLayouts and ResourceSlices"),
    "agent": ("tessera.cli.agent", "run the node agent: GPUs into the layout of this node's NodeLayout"),
    "demo": ("tessera.cli.demo", "run Tessera on a local control plane with simulated GPU nodes"),
    "status": ("tessera.cli.status", "per node and GPU: the layout, the published devices and the claims holding them"),
    "nic-attach": ("tessera.cli.nicattach", "CDI createRuntime hook: put a claim's NIC shares into the Pod's netns"),
    "mps-host": ("tessera.cli.mpshost", "start MPS control daemons for the node agent, outside its container"),
}

# name -> third-party modules made unimportable before that subcommand's module is imported, so
# that a library which uses them only when installed falls back without them. structlog imports
# rich (about 3 MiB resident, with pygments) whenever it is installed, only to draw exceptions on
# a terminal; the agent runs on every GPU node and logs JSON there (on a terminal, tracebacks are
# plain). Only the operator needs rich installed (common-expression-language).
LEFT_OUT: dict[str, tuple[str, ...]] = {"agent": ("rich",), "mps-host": ("rich",)}


def main(argv: Sequence[str] | None = None, prog: str = "tessera", only: Sequence[str] | None = None) -> int:
    """Run one subcommand; ``only`` limits which are offered (the kubectl plugin offers two)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=prog, description="Share GPUs on Kubernetes through DRA.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The top level has no option but --help, so the first word that is not an option is the command.
    command = next((word for word in argv if not word.startswith("-")), None)
    offered = {name: entry for name, entry in SUBCOMMANDS.items() if only is None or name in only}
    for name, (module_name, help_text) in offered.items():
        subparser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            for left_out in LEFT_OUT.get(name, ()):
                if left_out not in sys.modules:  # None there: importing it raises ImportError
                    sys.modules[left_out] = None  # type: ignore[assignment]
            importlib.import_module(module_name).add_arguments(subparser)
    args = parser.parse_args(argv)
    code: int = importlib.import_module(SUBCOMMANDS[args.command][0]).run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
