"""The node's MPS host: starts MPS control daemons for the agent, so they outlive the agent's container.

A container's processes end with it: the runtime kills every process in a container's cgroup
when its first process exits, however the process was started (``-d`` and a double fork do
not help). An MPS daemon started by the agent in its container therefore died with every agent
restart and every DaemonSet rolling update, and took its clients' GPU work along. So on a
cluster the daemons are started here, in a Pod of their own (the ``tessera-mps-host``
DaemonSet, updated only ``OnDelete``) that does nothing else and has no reason to restart.

Why a host process per node and not a Pod per daemon (NVIDIA's DRA driver runs a Deployment
per claim): the agent would need the right to create Pods (a privileged agent that may create
Pods can create any privileged Pod: an escalation this avoids), every first MPS share would
wait for a Pod to be scheduled and started (seconds) inside NodePrepareResources, and the
agent would depend on the API server to prepare a device; a request file on the node's MPS
folder needs none of it, and the NVML and simulated backends use it alike. What it costs:
deleting the MPS host's Pod ends every daemon on the node (hence ``OnDelete``: delete it when
no MPS client runs).

The protocol, on the host folder both Pods mount (``<root>/<device UUID>/``):

- the agent clears a stale pipe folder, writes ``tessera-mps-launch.json`` (``{"program": NAME}``)
  and waits for the daemon's pid file and ``control`` socket, as it does when it starts one;
- the host (``serve_once``, every ``interval``) starts ``PROGRAMS[NAME] -d`` with the folder's
  environment, or writes ``tessera-mps-launch.error`` saying why not, and removes the request.
  Only the programs it knows run: a request file cannot make it run anything else.

Everything else stays with the agent (``tessera.agent.backends.mps``): it reads the pid file
(both Pods share the host's PID namespace, so the pid is the same for both), sets defaults
and asks a daemon to ``quit`` through the control socket. Not for: deciding when a device
needs MPS (the reconciler), nor talking to the Kubernetes API (none is needed).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import structlog

from tessera.agent.backends.base import BackendError
from tessera.agent.backends.mps import (
    LAUNCH_ERROR,
    LAUNCH_REQUEST,
    CommandRunner,
    MpsDaemons,
    run_checked,
    run_command,
)
from tessera.agent.backends.simulated import STANDIN_MPS_CONTROL

log = structlog.get_logger(__name__)

# The programs a request may name: NVIDIA's control daemon (NVML backend) and the stand-in
# (simulated backend). Values are argv prefixes; the host adds ``-d``.
PROGRAMS: dict[str, tuple[str, ...]] = {
    "nvidia": ("nvidia-cuda-mps-control",),
    "standin": STANDIN_MPS_CONTROL,
}


class MpsHost:
    """Starts the daemons the agent asks for under ``root``."""

    def __init__(
        self, root: Path, programs: dict[str, tuple[str, ...]] | None = None, runner: CommandRunner = run_command
    ) -> None:
        self.root = root
        self.programs = dict(PROGRAMS if programs is None else programs)
        self.runner = runner
        self.paths = MpsDaemons(root, control=[])  # folder layout and pid checks only

    def pending(self) -> list[Path]:
        """The request files waiting, sorted."""
        return sorted(self.root.glob(f"*/{LAUNCH_REQUEST}")) if self.root.is_dir() else []

    def serve_once(self) -> list[str]:
        """Answer every waiting request; the device UUIDs whose daemon this started."""
        started = []
        for request in self.pending():
            device_uuid = request.parent.name
            try:
                self._launch(device_uuid, request)
                started.append(device_uuid)
            except BackendError as e:
                log.warning("could not start an MPS daemon", device=device_uuid, error=str(e))
                with contextlib.suppress(OSError):  # whole or not at all: the agent may read it any moment
                    tmp = request.parent / (LAUNCH_ERROR + ".tmp")
                    tmp.write_text(str(e))
                    os.replace(tmp, request.parent / LAUNCH_ERROR)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    request.unlink()
        return started

    def _launch(self, device_uuid: str, request: Path) -> None:
        what = f"start an MPS daemon for {device_uuid}"
        try:
            name = json.loads(request.read_text())["program"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BackendError(f"{what}: unreadable request {request}: {e}") from None
        program = self.programs.get(name) if isinstance(name, str) else None
        if program is None:
            known = ", ".join(sorted(self.programs))
            raise BackendError(f"{what}: unknown MPS program {name!r} (this host runs: {known})")
        if self.paths.pid(device_uuid) is not None:
            log.info("an MPS daemon already serves this device", device=device_uuid)
            return
        self.paths.pipe(device_uuid).mkdir(parents=True, exist_ok=True)
        (self.paths.folder(device_uuid) / "log").mkdir(parents=True, exist_ok=True)
        run_checked(self.runner, what, [*program, "-d"], self.paths.env(device_uuid), None)
        log.info("started an MPS daemon", device=device_uuid, pid=self.paths.pid(device_uuid))

    def serve(self, stop: threading.Event, interval_s: float = 0.1) -> None:
        """``serve_once`` every ``interval_s`` until ``stop`` is set."""
        self.root.mkdir(parents=True, exist_ok=True)
        log.info("the MPS host serves", root=str(self.root), programs=sorted(self.programs))
        while not stop.is_set():
            self.serve_once()
            stop.wait(interval_s)
