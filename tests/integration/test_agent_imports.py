"""``tessera agent`` runs without kubernetes-asyncio, Kopf or the local cluster's libraries, nor
aiohttp's web server, prometheus_client (the agent has its own small ``tessera.agent.metrics``),
rich (structlog's optional terminal tracebacks) or grpcio (its kubelet plugins serve with
grpclib, ``tessera.agent.plugin.rpc``), which it has no use for:
a real agent process (simulated GPUs, kubelet plugin on) runs against the real control plane
until it has reported its inventory in its NodeLayout's status, stops on SIGTERM, and lists
the modules it had loaded. The import contract in pyproject.toml checks the import graph; this
checks what a start that did real work loaded."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from pathlib import Path

import pytest

import tessera
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for

pytestmark = pytest.mark.integration

SOURCE = Path(tessera.__file__).resolve().parents[1]
CRD = Path(__file__).resolve().parents[2] / "crds" / "tessera.dev_nodelayouts.yaml"
NEVER_IN_THE_AGENT = ("kubernetes_asyncio", "kopf", "cryptography", "tessera.kube.objects", "tessera.controller",
                      "tessera.localcluster", "tessera.cli.operator", "tessera.cli.cluster", "tessera.cli.demo",
                      "aiohttp.web", "rich", "pygments", "prometheus_client", "grpc")
PRINT_MODULES_AT_EXIT = (
    "import atexit, json, os, sys\n"
    "atexit.register(lambda: open(os.environ['MODULES_OUT'], 'w').write(json.dumps(\n"
    "    sorted(name for name, module in sys.modules.items() if module is not None))))\n"  # None: kept out
    "from tessera.cli import main\n"
    "sys.exit(main())\n"
)


async def test_a_running_agent_never_loads_kubernetes_asyncio_kopf_operator_code_or_what_it_has_no_use_for(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster.apply(CRD)
    node = f"lean-{uuid.uuid4().hex[:8]}"
    cluster.add_node(node)
    modules_out, log = tmp_path / "modules.json", tmp_path / "agent.log"
    with log.open("wb") as log_file:  # a file, not a pipe nobody reads while we wait
            process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", PRINT_MODULES_AT_EXIT, "agent", "--node-name", node, "--simulate", "1xH100-80GB",
            "--kubeconfig", str(cluster.kubeconfig), "--metrics-port", "-1", "--mps-root", str(tmp_path / "mps"),
            "--kubelet-registry-dir", str(tmp_path / "registry"), "--kubelet-plugin-dir", str(tmp_path / "plugin"),
            "--cdi-dir", str(tmp_path / "cdi"),
            # PYTHONPATH: the Tessera under test, not whichever one the interpreter has installed
            env={"MODULES_OUT": str(modules_out), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(SOURCE)},
            stdout=log_file, stderr=asyncio.subprocess.STDOUT,
        )

    def reported() -> bool:
        out = cluster.kubectl("get", "nodelayouts.tessera.dev", node, "-o", "json", check=False)
        return out.returncode == 0 and len(json.loads(out.stdout).get("status", {}).get("gpus", [])) == 1

    try:
        await wait_for(reported, timeout=60, message="the agent's inventory in its NodeLayout's status")
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=60)
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)  # its NodeLayout goes with it
    assert process.returncode == 0, log.read_text()[-4000:]
    loaded = set(json.loads(modules_out.read_text()))
    assert "tessera.kube.http" in loaded, "the agent talked to the API through its own client"
    assert "grpclib.server" in loaded, "the agent served its kubelet plugin"
    for name in NEVER_IN_THE_AGENT:
        assert not {m for m in loaded if m == name or m.startswith(f"{name}.")}, f"the agent loaded {name}"
