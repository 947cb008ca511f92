"""``tessera mps-host``: run the node's MPS host (the ``tessera-mps-host`` DaemonSet's Pod).

It starts MPS control daemons when the node agent asks (``tessera.agent.backends.mpshost``),
so they outlive the agent's container. Flags have ``TESSERA_*`` environment equivalents.
Not for: the protocol itself (``tessera.agent.backends.mpshost``).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path
from types import FrameType

import structlog

from tessera.agent.backends.mpshost import MpsHost
from tessera.log import configure_logging

log = structlog.get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mps-root", type=Path, default=Path(os.environ.get("TESSERA_MPS_ROOT", "/run/tessera/mps")),
        help="the MPS pipe and log folders, shared with the agent (TESSERA_MPS_ROOT)",
    )
    parser.add_argument("--log-level", default=os.environ.get("TESSERA_LOG_LEVEL", "info"), help="TESSERA_LOG_LEVEL")
    parser.add_argument(
        "--log-json", action=argparse.BooleanOptionalAction,
        default=True if os.environ.get("TESSERA_LOG_JSON", "") == "1" else None,
        help="JSON logs (TESSERA_LOG_JSON=1; default: pretty on a terminal, JSON otherwise)",
    )


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_json)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    MpsHost(args.mps_root).serve(stop)
    log.info("the MPS host stops; the daemons it started keep running until this Pod's container ends")
    return 0
