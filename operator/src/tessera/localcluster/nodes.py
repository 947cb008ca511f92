"""Real nodes beside the local control plane: per node a kubelet and its own containerd
(runc, CNI bridge), so Pods really run, the kubelet really calls Tessera's DRA plugin and the
runtime really applies its CDI specs.

Each node lives in a folder of its own and a private mount namespace (held by a ``sleep``
made with ``unshare``) in which that folder's parts are bound over the places a node keeps
them: ``/var/lib/kubelet`` (the kubelet's root, plugin registry and plugin sockets),
``/var/run/cdi``, ``/run/tessera`` and ``/var/lib/tessera`` (on the host those stay empty
folders, made as mount points). The kubelet, containerd, the
containers and an agent started "on" the node all run in that namespace, so the agent
DaemonSet's host paths mean the same there as on any node, and the kubelet's mounts vanish
with the namespace. The namespace also has the node's own boot id bound over
``/proc/sys/kernel/random/boot_id``, so ``RealNode.reboot`` (every process of the node ends,
/run's folders are cleared, containerd and the kubelet start again) is a new boot to the agent.
Each node gets a Linux bridge with a private /24 whose first address is
the node's IP (the kubelet listens there, so ``kubectl logs`` works) and the gateway of its
Pods; Pods reach the apiserver at the ``kubernetes`` Service's ClusterIP through a DNAT rule
to the apiserver's loopback port (there is no kube-proxy). Needs root; ``real_nodes_possible``
says whether this machine allows them and why not.
Not for: building the binaries (``tessera.localcluster.nodebuild``); cheap kubelet-less
nodes (``LocalCluster.add_node``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from tessera.localcluster.build import LocalClusterError, cache_root
from tessera.localcluster.cluster import _die_with_parent, free_port
from tessera.localcluster.images import BUSYBOX_IMAGE, busybox_image, import_image
from tessera.localcluster.nodebuild import (
    DEBIAN_PACKAGES,
    NodeBinaries,
    ensure_node_binaries,
    find_busybox,
    find_cni_bin_dir,
    find_runc,
)
from tessera.localcluster.pki import KUBERNETES_SERVICE_IP

SUBNET_PREFIX = "10.250"
NODE_MOUNTS = {  # place inside the node's mount namespace -> sub-folder of the node's folder
    "/var/lib/kubelet": "kubelet",
    "/run/cdi": "cdi",  # /var/run is a link to /run
    "/run/tessera": "run-tessera",
    "/var/lib/tessera": "var-lib-tessera",
}
KUBELET_ROOT = "/var/lib/kubelet"
SIMULATED_STATE_DIR = "/var/lib/tessera"  # the agent DaemonSet's state folder
CDI_DIR = "/var/run/cdi"
BOOT_ID = "/proc/sys/kernel/random/boot_id"  # what tells one boot from the next (tessera.agent.plugin.boot)


class ClusterAccess(Protocol):
    """What a node needs of the control plane (``LocalCluster`` has it)."""

    server: str
    token: str
    ca_file: Path
    workdir: Path

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60.0) -> subprocess.CompletedProcess[str]: ...


def real_nodes_possible() -> str | None:
    """None when real nodes can run here; otherwise one line saying why not."""
    if os.geteuid() != 0:
        return "real nodes need root (a kubelet, containerd and runc); running as uid " + str(os.geteuid())
    for tool in ("unshare", "nsenter", "ip", "iptables"):
        if shutil.which(tool) is None:
            return (f"real nodes need {tool!r} on PATH: apt-get update && apt-get install -y "
                    f"{' '.join(DEBIAN_PACKAGES)} (scripts/bootstrap does it as root on Debian)")
    try:
        runc = find_runc()
        find_cni_bin_dir()
        busybox = find_busybox()
    except LocalClusterError as error:
        return str(error)
    if failure := runc_run_failure(runc, busybox):
        return f"runc cannot start a container here: {failure}"
    if shutil.which("go") is None and not (cache_root() / "bin").is_dir():
        return "real nodes need Go on PATH to build the kubelet and containerd"
    return None


@functools.cache
def runc_run_failure(runc: Path, busybox: Path) -> str | None:
    """Run ``busybox true`` in a container of its own with runc; None when it works, else why
    not (the last line runc printed)."""
    with tempfile.TemporaryDirectory(prefix="tessera-runc-probe-") as tmp:
        bundle = Path(tmp)
        (bundle / "rootfs").mkdir()
        shutil.copy(busybox, bundle / "rootfs" / "busybox")
        made = _run([str(runc), "spec", "--bundle", tmp], "runc spec", check=False)
        if made.returncode != 0:
            return made.stderr.strip().splitlines()[-1] if made.stderr.strip() else "runc spec failed"
        config = json.loads((bundle / "config.json").read_text())
        config["process"].update(terminal=False, args=["/busybox", "true"])
        config["root"]["readonly"] = True
        (bundle / "config.json").write_text(json.dumps(config))
        ran = _run([str(runc), "--root", str(bundle / "state"), "run", "--bundle", tmp, f"tessera-probe-{os.getpid()}"],
                   "runc run", check=False)
        if ran.returncode != 0:
            return ran.stderr.strip().splitlines()[-1] if ran.stderr.strip() else f"exit code {ran.returncode}"
    return None


def _run(argv: list[str], what: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise LocalClusterError(f"{what} failed ({' '.join(argv)}): {proc.stderr.strip()}")
    return proc


@contextlib.contextmanager
def _network_lock() -> Iterator[None]:
    path = Path("/run/tessera-nodes.lock")
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def used_subnets(ip_addr_output: str) -> set[int]:
    """The third octets of ``10.250.X.*`` addresses in ``ip -o -4 addr`` output."""
    return {int(m) for m in re.findall(rf"inet {re.escape(SUBNET_PREFIX)}\.(\d+)\.\d+/", ip_addr_output)}


def pick_subnet(ip_addr_output: str) -> int:
    used = used_subnets(ip_addr_output)
    for octet in range(1, 255):
        if octet not in used:
            return octet
    raise LocalClusterError(f"every {SUBNET_PREFIX}.X.0/24 is taken on this machine")


@dataclass
class _Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

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

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def overlay_works(scratch: Path) -> bool:
    """Whether an overlay filesystem can be mounted on top of ``scratch`` (containers then
    start without copying their image; elsewhere the native snapshotter copies it)."""
    parts = {name: scratch / name for name in ("lower", "upper", "work", "merged")}
    try:
        for part in parts.values():
            part.mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={parts['lower']},upperdir={parts['upper']},workdir={parts['work']}"
        mounted = _run(["mount", "-t", "overlay", "overlay", "-o", options, str(parts["merged"])], "overlay probe",
                       check=False).returncode == 0
        if mounted:
            _run(["umount", str(parts["merged"])], "overlay probe", check=False)
        return mounted
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def containerd_config(folder: Path, binaries: NodeBinaries, sandbox_image: str, snapshotter: str = "native") -> str:
    """containerd's config (version 4, containerd 2.4): its own root, state and sockets under
    ``folder`` and no host config imported; CRI with the node's CDI folder (CDI is on by
    default), runc, the node's CNI config, network namespaces under its state, the native
    snapshotter, a local sandbox image, and ``restrict_oom_score_adj`` (VMs that refuse a
    negative oom_score_adj fail runc otherwise)."""
    state = folder / "containerd"
    cri_runtime = {
        "cdi_spec_dirs": [CDI_DIR],
        "netns_mounts_under_state_dir": True,
        "restrict_oom_score_adj": True,
        "containerd": {
            "default_runtime_name": "runc",
            "runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2",
                                  "options": {"BinaryName": str(binaries.runc), "SystemdCgroup": False}}},
        },
        "cni": {"bin_dirs": [str(binaries.cni_bin_dir)], "conf_dir": str(folder / "cni" / "conf"),
                "max_conf_num": 1},
    }
    lines = [
        "version = 4",
        "imports = []",
        f"root = {json.dumps(str(state / 'root'))}",
        f"state = {json.dumps(str(state / 'state'))}",
        'disabled_plugins = ["io.containerd.nri.v1.nri"]',
        "[plugins.'io.containerd.server.v1.grpc']",
        f"  address = {json.dumps(str(state / 'containerd.sock'))}",
        "[plugins.'io.containerd.server.v1.ttrpc']",
        f"  address = {json.dumps(str(state / 'containerd.sock.ttrpc'))}",
        "[plugins.'io.containerd.cri.v1.images']",
        f"  snapshotter = {json.dumps(snapshotter)}",
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"  sandbox = {json.dumps(sandbox_image)}",
    ]
    lines += _toml_table("plugins.'io.containerd.cri.v1.runtime'", cri_runtime)
    return "\n".join(lines) + "\n"


def _toml_table(name: str, values: dict[str, Any]) -> list[str]:
    scalars = {k: v for k, v in values.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in values.items() if isinstance(v, dict)}
    out = [f"[{name}]"] + [f"  {k} = {json.dumps(v)}" for k, v in scalars.items()]
    for key, sub in tables.items():
        out += _toml_table(f"{name}.{key}", sub)
    return out


def cni_config(bridge: str, subnet: str, gateway: str, ipam_dir: Path) -> dict[str, Any]:
    """A bridge network with host-local addresses from the node's /24 (the bridge is the gateway)."""
    return {
        "cniVersion": "1.0.0",
        "name": f"tessera-{bridge}",
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(ipam_dir)}},
            {"type": "loopback"},
        ],
    }


def kubelet_config(node_ip: str, port: int, healthz_port: int, runtime_socket: Path, pod_logs: Path) -> dict[str, Any]:
    """The KubeletConfiguration a real node runs with (cgroup v1 and v2, no swap checks,
    no QoS cgroups, anonymous and allow-all on its own port, no image GC or disk eviction
    that would drop the locally imported images)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(pod_logs),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%", "imagefs.available": "0%",
                         "nodefs.inodesFree": "0%"},
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "serializeImagePulls": False,
        "resolvConf": "",
        "maxPods": 40,
    }


@dataclass
class RealNode:
    """One running real node. ``RealNode.start(cluster, name)``; ``stop()`` ends everything
    it started, containers included."""

    name: str
    folder: Path
    binaries: NodeBinaries
    cluster: ClusterAccess
    subnet_octet: int = 0
    kubelet_port: int = 0
    healthz_port: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    # Extra kubelet flags, after the node's own (a later flag wins: ``--v=4`` logs each DRA call).
    kubelet_flags: tuple[str, ...] = ()
    _holder: _Child | None = None
    _containerd: _Child | None = None
    _kubelet: _Child | None = None
    _nat_rule: list[str] = field(default_factory=list)
    snapshotter: str = "native"

    # -- names ---------------------------------------------------------------------------

    @property
    def ip(self) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet_octet}.1"

    @property
    def subnet(self) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet_octet}.0/24"

    @property
    def bridge(self) -> str:
        return f"tsn{self.subnet_octet}"

    @property
    def containerd_socket(self) -> Path:
        return self.folder / "containerd" / "containerd.sock"

    def host_path(self, node_path: str) -> Path:
        """Where a path inside the node's mount namespace lies in the host's view."""
        resolved = node_path.replace("/var/run/", "/run/", 1) if node_path.startswith("/var/run/") else node_path
        for inside, sub in NODE_MOUNTS.items():
            if resolved == inside or resolved.startswith(inside + "/"):
                return self.folder / sub / resolved[len(inside):].lstrip("/")
        return Path(node_path)

    def in_namespace(self) -> list[str]:
        """argv prefix that runs a command inside the node's mount namespace."""
        if self._holder is None:
            raise LocalClusterError(f"node {self.name} is not running")
        return ["nsenter", f"--mount=/proc/{self._holder.popen.pid}/ns/mnt", "--"]

    # -- lifecycle -----------------------------------------------------------------------

    @classmethod
    def start(cls, cluster: ClusterAccess, name: str, labels: dict[str, str] | None = None,
              binaries: NodeBinaries | None = None, timeout: float = 120.0,
              kubelet_flags: Sequence[str] = ()) -> RealNode:
        binaries = binaries or ensure_node_binaries()
        node = cls(name=name, folder=cluster.workdir / "nodes" / name, binaries=binaries, cluster=cluster,
                   labels=dict(labels or {}), kubelet_flags=tuple(kubelet_flags))
        try:
            node._start(timeout)
        except BaseException:
            node.stop()
            raise
        return node

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> _Child:
        log = self.folder / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, preexec_fn=_die_with_parent, cwd=self.folder)
        return _Child(name, popen, log)

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for sub in (*NODE_MOUNTS.values(), "cni/conf", "cni/ipam", "pod-logs", "containerd"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self._start_network()
        self._start_namespace()
        self._start_containerd(deadline)
        self.import_image(busybox_image(self.binaries.busybox, cache_root() / "images" / "busybox.tar"))
        self.start_kubelet()
        self.wait_ready(deadline)

    def _start_network(self) -> None:
        with _network_lock():
            self.subnet_octet = pick_subnet(_run(["ip", "-o", "-4", "addr"], "listing addresses").stdout)
            _run(["ip", "link", "add", self.bridge, "type", "bridge"], "creating the node's bridge")
            _run(["ip", "addr", "add", f"{self.ip}/24", "dev", self.bridge], "addressing the node's bridge")
        _run(["ip", "link", "set", self.bridge, "up"], "bringing the bridge up")
        # Pods reach the apiserver at the kubernetes Service's IP: DNAT to its loopback port.
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/route_localnet").write_text("1\n")
        port = self.cluster.server.rsplit(":", 1)[1]
        self._nat_rule = ["PREROUTING", "-i", self.bridge, "-d", KUBERNETES_SERVICE_IP, "-p", "tcp", "--dport",
                          "443", "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}"]
        _run(["iptables", "-t", "nat", "-A", *self._nat_rule], "adding the apiserver DNAT rule")
        conf = cni_config(self.bridge, self.subnet, self.ip, self.folder / "cni" / "ipam")
        (self.folder / "cni" / "conf" / "10-tessera.conflist").write_text(json.dumps(conf, indent=1))

    def _start_namespace(self) -> None:
        self._holder = self._spawn("namespace", ["unshare", "--mount", "--propagation", "private",
                                                 "sleep", "2147483647"])
        ns = Path(f"/proc/{self._holder.popen.pid}/ns/mnt")
        for _ in range(100):
            if ns.exists() and os.readlink(ns) != os.readlink("/proc/self/ns/mnt"):
                break
            time.sleep(0.02)
        for inside, sub in NODE_MOUNTS.items():
            Path(inside).mkdir(parents=True, exist_ok=True)  # the mount point, empty on the host
            _run([*self.in_namespace(), "mount", "--bind", str(self.folder / sub), inside],
                 f"binding {inside} for node {self.name}")
        # The node's own boot id, so that its reboot (``reboot``) is a new boot to what runs on it.
        self.boot_id_file.write_text(f"{uuid.uuid4()}\n")
        _run([*self.in_namespace(), "mount", "--bind", str(self.boot_id_file), BOOT_ID],
             f"binding the boot id of node {self.name}")

    def _start_containerd(self, deadline: float) -> None:
        config = self.folder / "containerd" / "config.toml"
        self.snapshotter = "overlayfs" if overlay_works(self.folder / "overlay-probe") else "native"
        config.write_text(containerd_config(self.folder, self.binaries, BUSYBOX_IMAGE, self.snapshotter))
        env = {**os.environ, "PATH": self.binaries.runtime_path}
        self._containerd = self._spawn("containerd", [*self.in_namespace(), str(self.binaries.containerd),
                                                      "--config", str(config), "--log-level", "warn"], env)
        self._wait(lambda: self.containerd_socket.is_socket() and self._ctr_ok(), self._containerd, deadline,
                   "containerd")

    def _ctr_ok(self) -> bool:
        return _run([str(self.binaries.ctr), "--address", str(self.containerd_socket), "version"], "ctr",
                    check=False).returncode == 0

    def start_kubelet(self) -> None:
        """Start (or restart) the kubelet; its state in the root dir carries over."""
        if self._kubelet is not None and self._kubelet.alive():
            raise LocalClusterError(f"the kubelet of {self.name} is running already")
        if not self.kubelet_port:
            self.kubelet_port, self.healthz_port = free_port(), free_port()
        kubeconfig = self.folder / "kubelet.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": self.cluster.server,
                                                        "certificate-authority": str(self.cluster.ca_file)}}],
            "users": [{"name": "kubelet", "user": {"token": self.cluster.token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "kubelet"}}],
            "current-context": "local",
        }))
        kubeconfig.chmod(0o600)
        config = self.folder / "kubelet.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(self.ip, self.kubelet_port, self.healthz_port,
                                                        self.containerd_socket, self.folder / "pod-logs")))
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        self._kubelet = self._spawn("kubelet", [
            *self.in_namespace(), str(self.binaries.kubelet),
            f"--config={config}", f"--kubeconfig={kubeconfig}", f"--root-dir={KUBELET_ROOT}",
            f"--hostname-override={self.name}", f"--node-ip={self.ip}",
            *([f"--node-labels={labels}"] if labels else []),
            "--v=1",
            *self.kubelet_flags,
        ])

    def stop_kubelet(self) -> None:
        if self._kubelet is not None:
            self._kubelet.stop()

    def wait_ready(self, deadline: float) -> None:
        def ready() -> bool:
            proc = self.cluster.kubectl("get", "node", self.name, "-o", "json", check=False)
            if proc.returncode != 0:
                return False
            conditions = json.loads(proc.stdout).get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        if self._kubelet is None:
            raise LocalClusterError(f"node {self.name} has no kubelet")
        self._wait(ready, self._kubelet, deadline, f"node {self.name} Ready")

    def _wait(self, ready: Any, child: _Child, deadline: float, what: str) -> None:
        while not ready():
            if not child.alive():
                raise LocalClusterError(f"{child.name} of node {self.name} exited ({child.popen.returncode}) "
                                        f"before {what}; its log ({child.log}) ends:\n{child.tail()}")
            if time.monotonic() > deadline:
                raise LocalClusterError(f"{what} did not happen in time; {child.name}'s log ends:\n{child.tail()}")
            time.sleep(0.2)

    def import_image(self, archive: Path) -> None:
        """Load a docker-archive tar into this node's containerd (where its kubelet finds it)."""
        import_image(self.binaries.ctr, str(self.containerd_socket), archive, self.snapshotter)

    @property
    def kubelet_log(self) -> Path:
        """The kubelet's log file (klog text: ``Lmmdd hh:mm:ss.uuuuuu pid file:line] msg``)."""
        return self.folder / "logs" / "kubelet.log"

    def kubelet_metrics(self) -> str:
        """The kubelet's /metrics text (through the apiserver's node proxy)."""
        return self.cluster.kubectl("get", "--raw", f"/api/v1/nodes/{self.name}:{self.kubelet_port}/proxy/metrics"
                                    ).stdout

    def stop(self) -> None:
        """Stop the kubelet, every container, containerd and the namespace; remove the network."""
        if self._kubelet is not None:
            self._kubelet.stop()
        if self._containerd is not None and self._containerd.alive():
            self._kill_tasks()
        for child in (self._containerd, self._holder):
            if child is not None:
                child.stop()
        self._kill_namespace_leftovers()
        if self._nat_rule:
            _run(["iptables", "-t", "nat", "-D", *self._nat_rule], "removing the DNAT rule", check=False)
            self._nat_rule = []
        if self.subnet_octet:
            _run(["ip", "link", "del", self.bridge], "removing the bridge", check=False)

    @property
    def boot_id_file(self) -> Path:
        return self.folder / "boot_id"

    def reboot(self, while_off: Callable[[], None] | None = None, timeout: float = 120.0) -> None:
        """Reboot the node as far as software can tell: every process in its mount namespace
        ends (kubelet, containers, containerd, agents and MPS daemons started there), what
        lives on tmpfs is gone (/run: CDI specs, MPS folders, containerd's state), ``while_off``
        runs (reset the simulated GPUs there), a new boot id is drawn, and containerd and the
        kubelet start again with their state under /var kept. The Node object and its Pods stay
        in the API, as they do while a real node reboots."""
        if self._kubelet is not None:
            self._kubelet.popen.kill()
            self._kubelet.popen.wait()
        if self._containerd is not None and self._containerd.alive():
            self._kill_tasks()
        if self._containerd is not None:
            self._containerd.popen.kill()
            self._containerd.popen.wait()
        self._kill_namespace_leftovers()
        self._kill_everything_in_namespace()
        for inside in ("/run/cdi", "/run/tessera"):
            # Empty, not removed: the namespace's bind mount holds on to this very folder.
            for entry in self.host_path(inside).iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        shutil.rmtree(self.folder / "containerd" / "state", ignore_errors=True)
        if while_off is not None:
            while_off()
        self.boot_id_file.write_text(f"{uuid.uuid4()}\n")  # in place: the bind mount keeps the inode
        deadline = time.monotonic() + timeout
        self._start_containerd(deadline)
        self.start_kubelet()
        self.wait_ready(deadline)

    def _kill_everything_in_namespace(self) -> None:
        """SIGKILL every process that lives in the node's mount namespace but its holder."""
        if self._holder is None:
            return
        holder = self._holder.popen.pid
        ns = os.readlink(f"/proc/{holder}/ns/mnt")
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) in (holder, os.getpid()):
                continue
            with contextlib.suppress(OSError):
                if os.readlink(proc / "ns" / "mnt") == ns:
                    os.kill(int(proc.name), signal.SIGKILL)

    def _kill_tasks(self) -> None:
        ctr = [str(self.binaries.ctr), "--address", str(self.containerd_socket), "-n", "k8s.io"]
        tasks = _run([*ctr, "tasks", "ls", "-q"], "listing tasks", check=False).stdout.split()
        for task in tasks:
            _run([*ctr, "tasks", "kill", "-s", "SIGKILL", task], "killing a task", check=False)
        for task in tasks:
            _run([*ctr, "tasks", "delete", "-f", task], "deleting a task", check=False, timeout=30)

    def _kill_namespace_leftovers(self) -> None:
        """Shims that outlived containerd: the processes still in the node's namespace."""
        if self._holder is None:
            return
        marker = self.folder.as_posix()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if "containerd-shim" in cmdline and marker in cmdline:
                    os.kill(int(proc.name), signal.SIGKILL)
