"""``tessera agent`` starts without kubernetes-asyncio, Kopf or the local cluster's libraries:
a real agent process (simulated GPUs, kubelet plugin on) runs against a fake apiserver until
it has made its first API calls, stops on SIGTERM, and lists the modules it had loaded.
The import contract in pyproject.toml checks the import graph; this checks what a start does."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

NODE = "lean-node"
NEVER_IN_THE_AGENT = ("kubernetes_asyncio", "kopf", "cryptography", "tessera.kube.objects", "tessera.controller",
                      "tessera.localcluster", "tessera.cli.operator", "tessera.cli.cluster", "tessera.cli.demo")
PRINT_MODULES_AT_EXIT = (
    "import atexit, json, os, sys\n"
    "atexit.register(lambda: open(os.environ['MODULES_OUT'], 'w').write(json.dumps(sorted(sys.modules))))\n"
    "from tessera.cli import main\n"
    "sys.exit(main())\n"
)


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """Knows no object (404 for everything); the event is set once the agent asked for its Node."""
    asked_for_node = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        if request.path == f"/api/v1/nodes/{NODE}":
            asked_for_node.set()
        return web.json_response({"kind": "Status", "reason": "NotFound", "message": "not here", "code": 404},
                                 status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    async with TestServer(app, host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/"), asked_for_node


async def test_a_running_agent_never_loads_kubernetes_asyncio_kopf_or_operator_code(
    apiserver: tuple[str, asyncio.Event], tmp_path: Path
) -> None:
    url, asked_for_node = apiserver
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "current-context": "fake",
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "agent"}}],
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "agent", "user": {"token": "t"}}],
    }))
    modules_out = tmp_path / "modules.json"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PRINT_MODULES_AT_EXIT, "agent", "--node-name", NODE, "--simulate", "1xH100-80GB",
        "--kubeconfig", str(kubeconfig), "--metrics-port", "-1", "--mps-root", str(tmp_path / "mps"),
        "--kubelet-registry-dir", str(tmp_path / "registry"), "--kubelet-plugin-dir", str(tmp_path / "plugin"),
        "--cdi-dir", str(tmp_path / "cdi"),
        env={"MODULES_OUT": str(modules_out), "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await asyncio.wait_for(asked_for_node.wait(), timeout=60)
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, output.decode()
    loaded = set(json.loads(modules_out.read_text()))
    assert "tessera.kube.http" in loaded, "the agent talked to the API through its own client"
    for name in NEVER_IN_THE_AGENT:
        assert not {m for m in loaded if m == name or m.startswith(f"{name}.")}, f"the agent loaded {name}"
