"""Start and stop a local control plane: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler on free loopback ports in a temporary folder.

The apiserver uses token authentication and RBAC, with service-account keys; the controller
manager runs only the controllers Tessera's tests rely on (ResourceClaims from templates,
garbage collection, namespaces, service accounts) and not node lifecycle, which would taint
the hand-made Nodes. Every child process gets PR_SET_PDEATHSIG, so a killed test run takes
its control plane with it. Not for: building binaries (``tessera.localcluster.build``).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import yaml

from tessera.localcluster.build import Binaries, LocalClusterError, ensure_binaries
from tessera.localcluster.pki import make_pki

ADMIN_USER = "tessera-admin"
CONTROLLERS = (
    "resourceclaim-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
)
# Real nodes run Deployments and DaemonSets (the install); kubelet-less nodes never would.
WORKLOAD_CONTROLLERS = ("deployment-controller", "replicaset-controller", "daemonset-controller")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the process that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    argv: list[str] = field(default_factory=list)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class LocalCluster:
    """A running control plane. ``start()`` it, ``stop()`` it (or use it as a context manager)."""

    binaries: Binaries
    workdir: Path
    server: str = ""
    kubeconfig: Path = field(default_factory=Path)
    scheduler_url: str = ""  # kube-scheduler's own HTTPS endpoint (/healthz, /metrics)
    etcd_url: str = ""  # etcd's client endpoint (plain HTTP on loopback)
    ca_file: Path = field(default_factory=Path)
    token: str = field(default="", repr=False)
    _processes: list[_Process] = field(default_factory=list, repr=False)
    _own_workdir: bool = False
    controllers: tuple[str, ...] = CONTROLLERS
    scheduler_args: tuple[str, ...] = ()
    controller_manager_args: tuple[str, ...] = ()
    apiserver_args: tuple[str, ...] = ()

    @classmethod
    def start(cls, binaries: Binaries | None = None, workdir: Path | None = None,
              timeout: float = 120.0, controllers: tuple[str, ...] = CONTROLLERS,
              scheduler_args: tuple[str, ...] = (), controller_manager_args: tuple[str, ...] = (),
              apiserver_args: tuple[str, ...] = ()) -> Self:
        """Build (if needed) and start every component; return once the apiserver is ready
        and the scheduler and controller manager answer their health checks. ``controllers``:
        which of kube-controller-manager's controllers run (add ``WORKLOAD_CONTROLLERS`` for
        real nodes that run Deployments and DaemonSets); ``scheduler_args``: extra
        kube-scheduler flags (benchmarks raise its client rate limits); ``controller_manager_args``
        and ``apiserver_args``: the same for kube-controller-manager and kube-apiserver (a
        benchmark turns the apiserver's profiling on)."""
        binaries = binaries or ensure_binaries()
        own = workdir is None
        workdir = workdir or Path(tempfile.mkdtemp(prefix="tessera-cluster-"))
        cluster = cls(binaries=binaries, workdir=workdir, _own_workdir=own, controllers=controllers,
                      scheduler_args=scheduler_args, controller_manager_args=controller_manager_args,
                      apiserver_args=apiserver_args)
        try:
            cluster._start(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lifecycle -----------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> _Process:
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
                cwd=self.workdir,
            )
        process = _Process(name, popen, log, argv)
        self._processes.append(process)
        return process

    def kill_apiserver(self) -> None:
        """SIGKILL kube-apiserver: a crash, as its clients see it (fault-injection tests)."""
        process = next(p for p in self._processes if p.name == "kube-apiserver")
        if process.popen.poll() is None:
            process.popen.kill()
            process.popen.wait()

    def pause(self, component: str) -> None:
        """SIGSTOP a component (say ``kube-scheduler``): it does nothing until :meth:`resume`.
        A benchmark lets work pile up this way, then measures how fast the component clears it."""
        self._component(component).popen.send_signal(signal.SIGSTOP)

    def resume(self, component: str) -> None:
        """SIGCONT a component :meth:`pause` stopped."""
        self._component(component).popen.send_signal(signal.SIGCONT)

    def scheduler_metrics(self) -> dict[str, float]:
        """kube-scheduler's Prometheus samples (``name{labels}`` -> value). It serves them to
        anyone on loopback, with a self-signed certificate of its own (not verified here)."""
        with urllib.request.urlopen(f"{self.scheduler_url}/metrics", timeout=10,
                                    context=ssl._create_unverified_context()) as response:
            text = response.read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def pid(self, component: str) -> int:
        """The process id of a running component (say ``kube-scheduler``): benchmarks read its
        CPU time from ``/proc/<pid>/stat``."""
        return self._component(component).popen.pid

    def _component(self, name: str) -> _Process:
        process = next((p for p in self._processes if p.name == name), None)
        if process is None or process.popen.poll() is not None:
            raise LocalClusterError(f"{name} is not running in this cluster")
        return process

    def compact_etcd(self) -> int:
        """Compact etcd's history up to now (what kube-apiserver does every 5 minutes): a watch
        that resumes from an older resourceVersion is then told 410 Gone and must list again.
        Returns the revision compacted to."""
        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            request = urllib.request.Request(f"{self.etcd_url}{path}", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer

        revision = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])  # any key: the header
        post("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def start_apiserver(self, timeout: float = 60.0) -> None:
        """Start kube-apiserver again, same port and flags, after ``kill_apiserver``."""
        old = next(p for p in self._processes if p.name == "kube-apiserver")
        if old.popen.poll() is None:
            return
        self._processes.remove(old)
        process = self._spawn(old.name, old.argv)
        self._wait(self._apiserver_ready, process, time.monotonic() + timeout, "kube-apiserver /readyz")

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pki = make_pki(self.workdir / "pki")
        self.ca_file = pki.ca_cert
        self.token = secrets.token_hex(24)
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(f'{self.token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        tokens.chmod(0o600)

        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        etcd_url = self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        etcd = self._spawn("etcd", [
            str(self.binaries.etcd),
            "--name=local",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=local=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])
        self._wait(lambda: _http_ok(f"{etcd_url}/health"), etcd, deadline, "etcd")

        self.server = f"https://127.0.0.1:{api_port}"
        apiserver = self._spawn("kube-apiserver", [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            # Real nodes' kubelets listen on their node IP; their hostnames resolve nowhere.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            # Without node lifecycle nothing would ever remove the not-ready taint it adds.
            "--disable-admission-plugins=TaintNodesByCondition",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            "--profiling=false",
            "--v=0",
            *self.apiserver_args,
        ])
        self._wait(self._apiserver_ready, apiserver, deadline, "kube-apiserver /readyz")
        self.kubeconfig = self.workdir / "kubeconfig"
        self._write_kubeconfig(self.kubeconfig)

        kcm_port, sched_port = free_port(), free_port()
        self.scheduler_url = f"https://127.0.0.1:{sched_port}"
        kcm = self._spawn("kube-controller-manager", [
            str(self.binaries.kube_controller_manager),
            f"--kubeconfig={self.kubeconfig}",
            f"--controllers={','.join(self.controllers)}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={kcm_port}",
            f"--cert-dir={self.workdir / 'kcm-certs'}",
            f"--root-ca-file={pki.ca_cert}",
            "--use-service-account-credentials=false",
            "--profiling=false",
            "--v=0",
            *self.controller_manager_args,
        ])
        scheduler = self._spawn("kube-scheduler", [
            str(self.binaries.kube_scheduler),
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={sched_port}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}",
            "--profiling=false",
            "--v=0",
            # kube-scheduler 1.36.5 counts a claim's consumed capacity twice for the few
            # milliseconds between its informer seeing the allocation and PreBind dropping the
            # claim from its in-flight set. A Pod tried then on a device with just enough room is
            # refused and waits in the unschedulable queue, which later allocations do not wake,
            # for five minutes by default. Here it waits 10 s (plus the queue's 30 s sweep).
            "--pod-max-in-unschedulable-pods-duration=10s",
            # Its metrics to anyone on loopback (tests read how it queued Pods).
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            *self.scheduler_args,
        ])
        self._wait(lambda: _http_ok(f"https://127.0.0.1:{kcm_port}/healthz", insecure=True),
                   kcm, deadline, "kube-controller-manager /healthz")
        self._wait(lambda: _http_ok(f"https://127.0.0.1:{sched_port}/healthz", insecure=True),
                   scheduler, deadline, "kube-scheduler /healthz")

    def _wait(self, ready: Any, process: _Process, deadline: float, what: str) -> None:
        delay = 0.05
        while True:
            if process.popen.poll() is not None:
                raise LocalClusterError(
                    f"{process.name} exited with code {process.popen.returncode} before {what} was ready; "
                    f"its log ({process.log}) ends:\n{process.tail()}"
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise LocalClusterError(f"{what} was not ready in time; {process.name}'s log ends:\n{process.tail()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _apiserver_ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, context=context, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Stop every process this cluster started (newest first) and remove its folder."""
        for process in reversed(self._processes):
            if process.popen.poll() is None:
                process.popen.terminate()
        for process in reversed(self._processes):
            try:
                process.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
        self._processes.clear()
        if self._own_workdir and not os.environ.get("TESSERA_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- access --------------------------------------------------------------------------

    def _write_kubeconfig(self, path: Path) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": ADMIN_USER, "user": {"token": self.token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": ADMIN_USER}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raises with kubectl's stderr when ``check``."""
        return ExistingCluster(self.kubeconfig, self.binaries).kubectl(*args, input=input, check=check,
                                                                      timeout=timeout)

    def get_json(self, *args: str) -> dict[str, Any]:
        return ExistingCluster(self.kubeconfig, self.binaries).get_json(*args)

    def apply_objects(self, objects: list[dict[str, Any]]) -> None:
        ExistingCluster(self.kubeconfig, self.binaries).apply_objects(objects)

    def apply(self, *paths: Path | str) -> None:
        """``kubectl apply --server-side`` every file or folder given."""
        for path in paths:
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))

    def add_node(self, name: str, labels: dict[str, str] | None = None,
                 allocatable: dict[str, str] | None = None) -> dict[str, Any]:
        """Create a Node object with a Ready status (there is no kubelet) and return it."""
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **(allocatable or {})}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "simulated node (no kubelet)", "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }],
            },
        }
        out = self.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(node))
        created: dict[str, Any] = json.loads(out.stdout)
        return created


@dataclass(frozen=True)
class ExistingCluster:
    """A cluster Tessera did not start (``--kubeconfig``): kubectl against it, nothing to stop."""

    kubeconfig: Path
    binaries: Binaries

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=input, capture_output=True, text=True, timeout=timeout, check=False,
        )
        if check and proc.returncode != 0:
            raise LocalClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def get_json(self, *args: str) -> dict[str, Any]:
        """``kubectl get -o json ARGS`` as a dict."""
        out: dict[str, Any] = json.loads(self.kubectl("get", "-o", "json", *args).stdout)
        return out

    def apply_objects(self, objects: list[dict[str, Any]]) -> None:
        """Server-side apply ``objects`` as one List (we own the fields we set)."""
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=body)


def kubectl_for(kubeconfig: Path, binaries: Binaries) -> ExistingCluster:
    if not kubeconfig.is_file():
        raise LocalClusterError(f"no kubeconfig at {kubeconfig}")
    return ExistingCluster(kubeconfig, binaries)


async def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.1,
                   message: str = "condition") -> Any:
    """Await ``predicate()`` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {message}")
        await asyncio.sleep(interval)


def _http_ok(url: str, insecure: bool = False) -> bool:
    context = ssl._create_unverified_context() if insecure else None
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
