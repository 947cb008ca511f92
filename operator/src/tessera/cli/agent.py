"""``tessera agent``: run the node agent of one node (a DaemonSet pod, or a local process).

Every flag has an environment variable (``TESSERA_NODE_NAME`` for ``--node-name`` and so on);
a flag wins over its variable. Configures logging once, builds the backend, runs
``NodeAgent`` until SIGTERM/SIGINT. Not for: the agent's logic (``tessera.agent``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, overload

import structlog

from tessera import DRIVER_NAME
from tessera.agent.backends.base import BackendError, DeviceBackend
from tessera.agent.backends.simstate import parse_simulate_spec
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.health import HealthTracker
from tessera.agent.nics.health import NicHealth
from tessera.agent.nics.simulated import simulated_nics
from tessera.agent.nics.spec import nic_items
from tessera.agent.nics.sysfs import discover_nics
from tessera.agent.plugin.cdi import DEFAULT_CDI_DIR
from tessera.agent.plugin.server import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, PluginConfig, serve_plugin
from tessera.agent.service import AgentConfig, NodeAgent
from tessera.kube.http import KubeClient
from tessera.kube.watch import idle_timeout_from_environment
from tessera.log import configure_logging
from tessera.models.nics import LinkState, NicStatus

if TYPE_CHECKING:
    from tessera.agent.nics.linkwatch import LinkWatcher
    from tessera.agent.nics.plugin import NicKubeletPlugin, NicPluginConfig

log = structlog.get_logger("tessera.agent")
DEFAULTS = AgentConfig(node_name="")  # the flags' defaults are the config's own


@overload
def _env(name: str) -> str | None: ...
@overload
def _env(name: str, default: str) -> str: ...
def _env(name: str, default: str | None = None) -> str | None:
    """The flag's environment variable, ``TESSERA_<name>``."""
    return os.environ.get(f"TESSERA_{name}", default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-name", default=_env("NODE_NAME"), help="this node's name (TESSERA_NODE_NAME)")
    parser.add_argument(
        "--backend",
        choices=("nvml", "simulated"),
        default=_env("BACKEND", "nvml"),
        help="how GPUs are reached (TESSERA_BACKEND, default nvml)",
    )
    parser.add_argument(
        "--simulate",
        default=_env("SIMULATE"),
        metavar="SPEC",
        help="simulated GPUs, e.g. 4xH100-80GB,2xA100-80GB (TESSERA_SIMULATE); implies --backend simulated",
    )
    parser.add_argument(
        "--state-file",
        default=_env("STATE_FILE"),
        type=Path,
        help="keep the simulated hardware in this file, so it outlives the process (TESSERA_STATE_FILE)",
    )
    parser.add_argument(
        "--simulated-dev-dir",
        default=_env("SIMULATED_DEV_DIR"),
        type=Path,
        help="make the simulated GPUs runnable: character devices for /dev/nvidia* in this host folder, "
        "named in the CDI specs (TESSERA_SIMULATED_DEV_DIR; needs root)",
    )
    parser.add_argument("--kubeconfig", default=_env("KUBECONFIG"), help="default: $KUBECONFIG, else in-cluster")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("METRICS_PORT", str(DEFAULTS.metrics_port)) or str(DEFAULTS.metrics_port)),
        help="/metrics and /healthz port, 0 for any free port, -1 for none (TESSERA_METRICS_PORT)",
    )
    parser.add_argument(
        "--metrics-host", default=_env("METRICS_HOST", DEFAULTS.metrics_host),
        help="address to listen on (TESSERA_METRICS_HOST)",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=float(_env("RESYNC_SECONDS", str(DEFAULTS.resync_seconds)) or DEFAULTS.resync_seconds),
        help="reconcile at least this often (TESSERA_RESYNC_SECONDS)",
    )
    parser.add_argument(
        "--mps-root", default=_env("MPS_ROOT", "/run/tessera/mps"), help="MPS pipe and log folders (TESSERA_MPS_ROOT)"
    )
    parser.add_argument(
        "--mps-daemons",
        choices=("agent", "host"),
        default=_env("MPS_DAEMONS", "agent"),
        help="who starts MPS control daemons: the agent itself (a local process), or the node's MPS host "
        "(`tessera mps-host`, a Pod of its own, so daemons outlive the agent's container) (TESSERA_MPS_DAEMONS)",
    )
    parser.add_argument(
        "--health-recovery-seconds",
        type=float,
        default=float(_env("HEALTH_RECOVERY_SECONDS", str(DEFAULTS.health_recovery_seconds))
                      or str(DEFAULTS.health_recovery_seconds)),
        help="an unhealthy GPU (fatal XID, ECC) is healthy again after this long without a new error; "
        "0: only a GPU reset clears it "
        f"(TESSERA_HEALTH_RECOVERY_SECONDS, default {DEFAULTS.health_recovery_seconds:g})",
    )
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "info"), help="TESSERA_LOG_LEVEL")
    parser.add_argument(
        "--log-json",
        action=argparse.BooleanOptionalAction,
        default=True if _env("LOG_JSON", "") == "1" else None,
        help="JSON logs (TESSERA_LOG_JSON=1; default: pretty on a terminal, JSON otherwise)",
    )
    _add_plugin_arguments(parser)


def _add_plugin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubelet-plugin",
        action=argparse.BooleanOptionalAction,
        default=_env("KUBELET_PLUGIN", "true").lower() not in ("0", "false", "no"),
        help="serve the DRA kubelet plugin (TESSERA_KUBELET_PLUGIN, default on)",
    )
    parser.add_argument(
        "--kubelet-registry-dir",
        type=Path,
        default=Path(_env("KUBELET_REGISTRY_DIR", str(DEFAULT_REGISTRY_DIR))),
        help="the kubelet's plugin registry folder (TESSERA_KUBELET_REGISTRY_DIR)",
    )
    parser.add_argument(
        "--kubelet-plugin-dir",
        type=Path,
        default=Path(_env("KUBELET_PLUGIN_DIR", str(DEFAULT_PLUGINS_DIR / DRIVER_NAME))),
        help="the plugin's socket and checkpoint folder (TESSERA_KUBELET_PLUGIN_DIR)",
    )
    parser.add_argument(
        "--nic-interfaces",
        default=_env("NIC_INTERFACES", ""),
        help="virtual interfaces to report as NICs besides the PCI ones, e.g. a veth standing in for an uplink "
        "(TESSERA_NIC_INTERFACES, comma-separated)",
    )
    parser.add_argument(
        "--nic-attach-executable",
        default=_env("NIC_ATTACH_EXECUTABLE", "/usr/local/bin/tessera"),
        help="the host path of the tessera command that CDI runs to attach NIC shares (TESSERA_NIC_ATTACH_EXECUTABLE)",
    )
    parser.add_argument(
        "--nic-attach-in-agent-namespace",
        action=argparse.BooleanOptionalAction,
        default=_env("NIC_ATTACH_IN_AGENT_NAMESPACE", "false").lower() in ("1", "true", "yes"),
        help="the agent runs in a container (the DaemonSet, with hostPID): the attach hook enters its mount "
        "namespace to run --nic-attach-executable from the image (TESSERA_NIC_ATTACH_IN_AGENT_NAMESPACE)",
    )
    parser.add_argument(
        "--cdi-dir",
        type=Path,
        default=Path(_env("CDI_DIR", str(DEFAULT_CDI_DIR))),
        help="where CDI specs are written (TESSERA_CDI_DIR)",
    )


def make_nic_inventory(args: argparse.Namespace) -> Callable[[], Sequence[NicStatus]] | None:
    """The NICs this agent reports: the simulated ones its ``--simulate`` spec names, or else
    every PCI NIC in sysfs plus ``--nic-interfaces`` (on real hardware, and beside simulated GPUs
    when interfaces are named: a real node's veth standing in for an uplink); none: no NIC
    family. A NIC that goes away is still reported, ``Absent``, with what was last known of it."""
    named = [n.strip() for n in (args.nic_interfaces or "").split(",") if n.strip()]
    if args.simulate or args.backend == "simulated":
        if nic_items(args.simulate or ""):
            gpu_count = len(parse_simulate_spec(args.simulate))
            return lambda: simulated_nics(args.node_name, args.simulate, gpu_count)
        if not named:
            return None
    last_known: dict[str, NicStatus] = {}

    def discover() -> Sequence[NicStatus]:
        nics = discover_nics(Path("/sys"), named, last_known)
        last_known.update({n.interface: n for n in nics if n.link is not LinkState.ABSENT})
        return nics

    return discover


def make_nic_plugin_config(args: argparse.Namespace) -> NicPluginConfig:
    """Where the NIC plugin keeps its sockets and checkpoint (beside the GPU plugin's folder), and
    how its attach hook reaches the ``tessera`` command."""
    from tessera.agent.nics.plugin import NicPluginConfig
    from tessera.dra.nics import NIC_DRIVER

    return NicPluginConfig(
        node_name=args.node_name,
        registry_dir=args.kubelet_registry_dir,
        plugin_dir=args.kubelet_plugin_dir.parent / NIC_DRIVER,
        cdi_dir=args.cdi_dir,
        hook_executable=args.nic_attach_executable,
        hook_in_agent_namespace=args.nic_attach_in_agent_namespace,
    )


def make_nic_plugin(
    args: argparse.Namespace, api: KubeClient, nics: Callable[[], Sequence[NicStatus]], health: NicHealth | None = None
) -> NicKubeletPlugin:
    """The NIC family's kubelet plugin, its folder beside the GPU plugin's."""
    from tessera.agent.nics.family import NicFamily
    from tessera.agent.nics.plugin import KubeSliceReader, NicKubeletPlugin
    from tessera.agent.nics.shaping import UplinkShaper
    from tessera.agent.plugin.claims import KubeClaimReader, KubeClaimStatusWriter
    from tessera.dra.nics import NIC_DRIVER

    config = make_nic_plugin_config(args)
    family = NicFamily(config.checkpoint, UplinkShaper())
    status = KubeClaimStatusWriter(api, f"{NIC_DRIVER}/{config.node_name}"[:128])
    return NicKubeletPlugin(config, family, KubeClaimReader(api), nics, slices=KubeSliceReader(api), status=status,
                            health=health)  # fmt: skip


def watch_nic_links(args: argparse.Namespace, health: NicHealth, agent: NodeAgent) -> LinkWatcher | None:
    """Link events of the host's NICs (not of simulated ones): a change of a NIC the agent reports
    updates its health at once and runs a pass for it (the status, then the operator's taint); a
    lost event runs a pass too, which reads every link."""
    if nic_items(args.simulate or ""):
        return None
    from tessera.agent.nics.linkwatch import LinkWatcher

    def on_link(interface: str, state: LinkState) -> None:
        if health.link_changed(interface, state):
            log.info("NIC link changed", interface=interface, link=state.value)
            agent.request_resync()

    watcher = LinkWatcher(on_link, on_overflow=agent.request_resync)
    try:
        watcher.start()
    except (RuntimeError, TimeoutError) as error:  # the passes still read every link
        log.warning("cannot watch link events; NIC links are read at each pass only", error=str(error))
        return None
    return watcher


def make_backend(args: argparse.Namespace) -> DeviceBackend:
    """The backend the flags ask for. Raises ValueError with a fix when they do not fit."""
    if args.simulate or args.backend == "simulated":
        if not args.simulate:
            raise ValueError("--backend simulated needs --simulate SPEC, e.g. --simulate 2xH100-80GB")
        # MPS daemons are real stand-in processes, as an agent on a real node runs real ones.
        return SimulatedBackend.from_spec(
            args.node_name, args.simulate, args.state_file, args.mps_root, mps_processes=True,
            device_dir=args.simulated_dev_dir, mps_host=args.mps_daemons == "host",
        )
    from tessera.agent.backends.nvml import NvmlBackend

    return NvmlBackend(mps_root=args.mps_root, mps_host=args.mps_daemons == "host")


async def _serve(args: argparse.Namespace, backend: DeviceBackend, api: KubeClient) -> None:
    config = AgentConfig(
        node_name=args.node_name,
        resync_seconds=args.resync_seconds,
        metrics_host=args.metrics_host,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        health_recovery_seconds=args.health_recovery_seconds,
    )
    agent = NodeAgent(config, backend, api, HealthTracker(config.health_recovery_seconds))
    nic_inventory = make_nic_inventory(args)
    nic_health = NicHealth()
    agent.nic_inventory = nic_health.observing(nic_inventory) if nic_inventory is not None else None
    link_watcher = watch_nic_links(args, nic_health, agent) if nic_inventory is not None else None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    plugin_task: asyncio.Task[None] | None = None
    nic_plugin: NicKubeletPlugin | None = None
    try:
        if args.kubelet_plugin:
            # The plugin starts first: it re-declares the holds of claims it prepared before a
            # restart, and those holds are what keep the reconciler off prepared devices.
            plugin_config = PluginConfig(
                node_name=args.node_name,
                registry_dir=args.kubelet_registry_dir,
                plugin_dir=args.kubelet_plugin_dir,
                cdi_dir=args.cdi_dir,
                dev_root=args.simulated_dev_dir if isinstance(backend, SimulatedBackend) else None,
            )
            plugin_config.registry_dir.mkdir(parents=True, exist_ok=True)
            plugin_config.plugin_folder.mkdir(parents=True, exist_ok=True)
            plugin_config.cdi_dir.mkdir(parents=True, exist_ok=True)
            started = asyncio.Event()
            plugin = serve_plugin(
                plugin_config, backend, api, agent.stopping, lambda _: started.set(), agent.request_resync,
                agent.health, agent.metrics.observe_claim, agent.metrics.registry, agent.claims,
            )
            plugin_task = asyncio.create_task(plugin, name="kubelet-plugin")
            done, _ = await asyncio.wait(
                {plugin_task, asyncio.create_task(started.wait())}, return_when=asyncio.FIRST_COMPLETED
            )
            if plugin_task in done:
                plugin_task.result()  # it failed to start: raise why
            if agent.nic_inventory is not None:  # the NIC family's plugin, driver nic.tessera.dev
                nic_plugin = make_nic_plugin(args, api, agent.nic_inventory, nic_health)
                await nic_plugin.start()
        await agent.run()
    finally:
        agent.stop()
        if link_watcher is not None:
            link_watcher.stop()
        if nic_plugin is not None:
            await nic_plugin.stop()
        if plugin_task is not None:
            await plugin_task
        await api.close()


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_json)
    if not args.node_name:
        log.error("no node name: pass --node-name or set TESSERA_NODE_NAME (in a pod: the downward API spec.nodeName)")
        return 2
    try:
        idle_timeout_from_environment()  # read again by each watch: a bad value stops the agent here
        backend = make_backend(args)
    except (ValueError, BackendError) as e:
        log.error("bad agent settings", error=str(e))
        return 2
    try:
        api = KubeClient.from_environment(args.kubeconfig)
    except (OSError, ValueError) as e:
        log.error("cannot read the API server's address and credentials", error=str(e))
        backend.close()
        return 2
    structlog.contextvars.bind_contextvars(node=args.node_name)
    log.info("starting the node agent", backend=backend.name, inventory=len(backend.inventory().gpus))
    try:
        asyncio.run(_serve(args, backend, api))
    finally:
        with contextlib.suppress(Exception):
            backend.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="tessera agent")
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
