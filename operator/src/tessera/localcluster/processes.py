"""Run Tessera's own processes (the operator, node agents with the simulated backend) next
to a local control plane, as the demo and the integration tests do: each is a real
``python -m tessera`` child process with its own log file, killed with its parent.
Not for: production (the DaemonSet and Deployment in ``manifests/`` run these there).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tessera import DRIVER_NAME
from tessera.localcluster.cluster import _die_with_parent, free_port
from tessera.localcluster.nodes import CDI_DIR, KUBELET_ROOT, SIMULATED_STATE_DIR, RealNode


class HasKubeconfig(Protocol):
    @property
    def kubeconfig(self) -> Path: ...


# The agent's environment as its DaemonSet sets it (manifests/agent.yaml, the chart), beyond its
# flags: glibc's malloc keeps blocks of 128 KiB and more in mappings of their own, given back when
# freed. By default glibc raises that bar to the largest such block it has freed and from then on
# carves them from the heap; the 256 KiB TLS buffer of every connection the agent reopens after an
# apiserver restart then fragmented its heap, which grew ~6 MiB an hour in bench_churn's long run
# (free space inside the heap growing, the bytes in use flat); with the bar fixed it stays flat.
AGENT_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": "131072"}


@dataclass
class TesseraProcess:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    metrics_port: int = 0
    health_port: int = 0
    ready_port: int = 0

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the process can tell."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def freeze(self) -> None:
        """SIGSTOP: the process stops where it is (a stalled VM, a long pause), sockets open."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after ``freeze``."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)

    def role(self) -> str | None:
        """An operator's ``/readyz``: "leader", "standby", "starting", or None when it does not answer."""
        if not self.ready_port:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ready_port}/readyz", timeout=1) as response:
                return str(response.read().decode().strip())
        except urllib.error.HTTPError as error:
            return str(error.read().decode().strip()) or None
        except (urllib.error.URLError, OSError):
            return None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def metrics(self) -> dict[str, float]:
        """The process's Prometheus metrics as ``{'name{labels}': value}`` (empty if unreachable)."""
        if not self.metrics_port:
            return {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as response:
                text = response.read().decode()
        except (urllib.error.URLError, OSError):
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    continue
        return out


@dataclass
class TesseraProcesses:
    """The operator and agents started for one cluster; ``stop_all`` ends them."""

    cluster: HasKubeconfig
    folder: Path
    processes: list[TesseraProcess] = field(default_factory=list)

    def _start(
        self,
        name: str,
        args: list[str],
        health: bool = False,
        env: Mapping[str, str | None] | None = None,
        prefix: list[str] | None = None,
        module: str = "tessera",
    ) -> TesseraProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = self.folder / f"{name}.log"
        metrics, health_port = free_port(), (free_port() if health else 0)
        ready_port = free_port() if health else 0
        ports = ["--metrics-port", str(metrics)] + (
            ["--health-port", str(health_port), "--ready-port", str(ready_port)] if health else [])
        settings: dict[str, str | None] = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "TESSERA_LOG_JSON": "1",
            **(env or {}),
        }
        environment = {name: value for name, value in settings.items() if value is not None}  # None: unset
        with log.open("ab") as out:
            popen = subprocess.Popen(  # argv is ours
                [*(prefix or []), sys.executable, "-m", module, *args, *ports],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment,
                preexec_fn=_die_with_parent,  # runs between fork and exec
            )
        process = TesseraProcess(name, popen, log, metrics, health_port, ready_port)
        self.processes.append(process)
        return process

    def operator(self, name: str = "operator", env: Mapping[str, str | None] | None = None,
                 module: str = "tessera") -> TesseraProcess:
        """An operator replica (``tessera operator``). Its Lease lives in ``default`` (a bare
        cluster has no ``tessera-system``); several replicas started here elect one leader
        between them. ``module`` runs it through another ``python -m`` entry point that takes
        the same arguments (a test's wrapper that injects a fault)."""
        return self._start(name, ["operator"], health=True, module=module,
                           env={"TESSERA_LEASE_NAMESPACE": "default", **(env or {})})

    def operators(self) -> list[TesseraProcess]:
        return [p for p in self.processes if p.ready_port]

    def node_folder(self, node: str) -> Path:
        """Where a node's agent keeps what a real node keeps under /var: the simulated GPUs'
        state, the kubelet plugin's sockets and checkpoint, and CDI specs."""
        return self.folder / "nodes" / node

    def agent(self, node: str, simulate: str, extra: list[str] | None = None,
              env: Mapping[str, str | None] | None = None, module: str = "tessera") -> TesseraProcess:
        """A node's agent as a process of this machine, with ``AGENT_ENVIRONMENT``; ``env`` adds
        to it or, where a value is None, unsets (a benchmark's allocator setting to compare), and
        ``module`` is as for ``operator`` (a benchmark's memory witness)."""
        root = self.node_folder(node)
        return self._start(
            f"agent-{node}",
            ["agent", "--node-name", node, "--backend", "simulated", "--simulate", simulate,
             "--state-file", str(root / "simulated-gpus.json"),
             "--kubelet-registry-dir", str(root / "plugins_registry"),
             "--kubelet-plugin-dir", str(root / "plugins" / "gpu.tessera.dev"),
             "--cdi-dir", str(root / "cdi"),
             "--mps-root", str(root / "mps"),
             *(extra or [])],
            env={**AGENT_ENVIRONMENT, **(env or {})}, module=module,
        )

    def agent_on(self, node: RealNode, simulate: str, extra: list[str] | None = None) -> TesseraProcess:
        """The agent of a real node, run as its DaemonSet Pod would: inside the node's mount
        namespace with the DaemonSet's paths (the kubelet's plugin folders, the CDI folder
        the node's containerd reads, /run/tessera/mps), simulated GPUs made runnable."""
        return self._start(
            f"agent-{node.name}",
            ["agent", "--node-name", node.name, "--backend", "simulated", "--simulate", simulate,
             "--state-file", f"{SIMULATED_STATE_DIR}/simulated-gpus.json",
             "--simulated-dev-dir", f"{SIMULATED_STATE_DIR}/dev",
             "--kubelet-registry-dir", f"{KUBELET_ROOT}/plugins_registry",
             "--kubelet-plugin-dir", f"{KUBELET_ROOT}/plugins/{DRIVER_NAME}",
             "--cdi-dir", CDI_DIR,
             "--mps-root", "/run/tessera/mps",
             *(extra or [])],
            prefix=node.in_namespace(), env=AGENT_ENVIRONMENT,
        )

    def stop_all(self) -> None:
        """Stop every process, and the MPS daemons the agents started (they outlive an agent by
        design: on a real node they keep serving across an agent restart)."""
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        for pid_file in sorted(self.folder.glob("nodes/*/mps/*/pipe/nvidia-cuda-mps-control.pid")):
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
            except (OSError, ValueError):
                continue  # gone already, or not a pid
