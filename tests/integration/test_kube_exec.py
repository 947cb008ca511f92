"""A kubeconfig ``exec`` credential plugin against the real kube-apiserver: a small shell script
plays the plugin (as ``aws eks get-token`` or ``gke-gcloud-auth-plugin`` would) and prints a
real ServiceAccount token the test asks the apiserver for (TokenRequest). The apiserver's
SelfSubjectReview says who the client is. Proved here: the plugin is run once and its token
kept while it is fresh, run again when the announced expiry has come and after a 401, and a
plugin that fails is an error that says so."""

from __future__ import annotations

import json
import stat
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from tessera.kube.execauth import ExecCredentialError
from tessera.kube.http import KubeClient, load_kubeconfig
from tessera.localcluster import LocalCluster

pytestmark = pytest.mark.integration

PLUGIN = """#!/bin/sh
# A credential plugin: the Nth run prints the Nth line of tokens (the last once they run out).
set -e
n=$(cat "$PLUGIN_DIR/runs" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$PLUGIN_DIR/runs"
printf '%s' "$KUBERNETES_EXEC_INFO" > "$PLUGIN_DIR/exec-info"
if [ -f "$PLUGIN_DIR/fail" ]; then echo "login expired: run the login command again" >&2; exit 3; fi
token=$(sed -n "${n}p" "$PLUGIN_DIR/tokens"); [ -n "$token" ] || token=$(tail -n 1 "$PLUGIN_DIR/tokens")
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
printf '"status":{"token":"%s","expirationTimestamp":"%s"}}' "$token" "$(cat "$PLUGIN_DIR/expiry")"
"""
REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


@dataclass
class Plugin:
    folder: Path
    kubeconfig: Path
    account: str  # system:serviceaccount:<namespace>:<name>
    token: str

    def serve(self, *tokens: str, expires_in: timedelta = timedelta(hours=1)) -> None:
        (self.folder / "tokens").write_text("".join(f"{t}\n" for t in tokens))
        stamp = (datetime.now(UTC) + expires_in).strftime("%Y-%m-%dT%H:%M:%SZ")
        (self.folder / "expiry").write_text(stamp)

    @property
    def runs(self) -> int:
        runs = self.folder / "runs"
        return int(runs.read_text()) if runs.exists() else 0


async def whoami(client: KubeClient) -> str:
    answer = await client.create(REVIEW, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(answer["status"]["userInfo"]["username"])


def write_plugin_kubeconfig(admin: Path, folder: Path) -> Path:
    """The admin kubeconfig's cluster, with the plugin script as its user."""
    script = folder / "bin" / "get-token"
    script.parent.mkdir()
    script.write_text(PLUGIN)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    config = yaml.safe_load(admin.read_text())
    config["users"] = [{"name": "robot", "user": {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "bin/get-token", "interactiveMode": "Never",
        "env": [{"name": "PLUGIN_DIR", "value": str(folder)}], "provideClusterInfo": True,
    }}}]
    config["contexts"][0]["context"]["user"] = "robot"
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    return kubeconfig


@pytest.fixture
async def plugin(cluster: LocalCluster, tmp_path: Path) -> AsyncIterator[Plugin]:
    """A ServiceAccount with a token from the apiserver, and a kubeconfig whose user is the
    plugin script (named relative to the kubeconfig's folder, as people write them)."""
    namespace, name = f"exec-{uuid.uuid4().hex[:8]}", "robot"
    async with KubeClient(load_kubeconfig(cluster.kubeconfig)) as admin:
        await admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        await admin.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
        request = await admin.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}},
        )
        kubeconfig = write_plugin_kubeconfig(Path(cluster.kubeconfig), tmp_path)
        try:
            yield Plugin(tmp_path, kubeconfig, f"system:serviceaccount:{namespace}:{name}",
                         str(request["status"]["token"]))
        finally:
            await admin.delete(f"/api/v1/namespaces/{namespace}")


async def test_the_plugins_token_is_used_and_kept_while_fresh(plugin: Plugin) -> None:
    plugin.serve(plugin.token)
    async with KubeClient(load_kubeconfig(plugin.kubeconfig)) as client:
        assert await whoami(client) == plugin.account
        assert await whoami(client) == plugin.account
        assert client.token_expires_at is not None
    assert plugin.runs == 1, "a token an hour from expiry is not asked for again"
    info = json.loads((plugin.folder / "exec-info").read_text())
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == yaml.safe_load(plugin.kubeconfig.read_text())["clusters"][0][
        "cluster"]["server"], "provideClusterInfo hands the plugin the cluster"


async def test_a_refused_token_runs_the_plugin_again_once(plugin: Plugin) -> None:
    plugin.serve("a-token-the-apiserver-does-not-know", plugin.token)
    async with KubeClient(load_kubeconfig(plugin.kubeconfig)) as client:
        assert await whoami(client) == plugin.account, "the 401 was answered by a second run, then a retry"
        assert plugin.runs == 2
        assert await whoami(client) == plugin.account
    assert plugin.runs == 2


async def test_a_token_past_its_announced_expiry_is_asked_for_again_before_the_request(plugin: Plugin) -> None:
    plugin.serve(plugin.token, expires_in=timedelta(seconds=-5))
    async with KubeClient(load_kubeconfig(plugin.kubeconfig)) as client:
        assert await whoami(client) == plugin.account
        assert await whoami(client) == plugin.account
    assert plugin.runs == 2, "each request found the token due and ran the plugin first"


async def test_a_failing_plugin_is_an_error_that_says_what_it_said(plugin: Plugin) -> None:
    plugin.serve(plugin.token)
    (plugin.folder / "fail").touch()
    async with KubeClient(load_kubeconfig(plugin.kubeconfig)) as client:
        with pytest.raises(ExecCredentialError, match="exit status 3: login expired: run the login command again"):
            await whoami(client)
