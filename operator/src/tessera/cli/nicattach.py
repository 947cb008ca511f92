"""``tessera nic-attach``: the CDI ``createRuntime`` hook that puts a claim's prepared NIC shares
into the Pod's network namespace (``tessera.agent.nics.family`` says why a hook, and when it runs).

The runtime runs it with the container's OCI state on stdin; it reads the checkpoint the node
agent keeps, moves each prepared share's macvlan into ``/proc/<pid>/ns/net`` as ``net1``, and
exits 0, or non-zero with the reason on stderr and in a file the agent reports on the claim
(``tessera.agent.nics.report``; the runtime then fails the container, and the kubelet retries it;
nothing half-attached is left). Not for: preparing shares (the agent does).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from tessera.agent.nics.family import NicFamily, attach_from_runtime_state
from tessera.agent.nics.report import clear_attach_failure, record_attach_failure
from tessera.agent.nics.shaping import ShapingError, UplinkShaper


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=Path, required=True, help="the node agent's NIC checkpoint file")
    parser.add_argument("--claim", required=True, help="the ResourceClaim UID whose shares to attach")
    parser.add_argument(
        "--host-netns", default=None,
        help="the named network namespace the shares were made in (default: this process's; tests use a lab)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    family = NicFamily(args.checkpoint, UplinkShaper(args.host_netns))
    try:
        attach_from_runtime_state(family, args.claim, sys.stdin.read())
    except (ShapingError, ValueError, OSError) as error:
        print(f"tessera nic-attach: {error}", file=sys.stderr)
        with contextlib.suppress(OSError, ValueError):  # the agent reports it on the claim
            record_attach_failure(args.checkpoint, args.claim, str(error))
        return 1
    with contextlib.suppress(OSError):
        clear_attach_failure(args.checkpoint, args.claim)
    return 0
