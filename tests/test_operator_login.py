"""Kopf's login in the operator takes the credentials of Tessera's own client: one kubeconfig
path and one parser serve both (an exec plugin included), and each login asks afresh (Kopf
logs in again when its token expired or was refused)."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tessera.controller.handlers import login

PLUGIN = """#!/bin/sh
n=$(cat "$0.runs" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$0.runs"
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
printf '"status":{"token":"token-%s","expirationTimestamp":"2099-01-01T00:00:00Z"}}' "$n"
"""


async def test_kopf_logs_in_with_the_exec_plugins_token_fetched_afresh_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "get-token"
    script.write_text(PLUGIN)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    config = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "me"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://k:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "me", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                   "command": "./get-token"}}}],
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    memo = SimpleNamespace()

    first = await login(memo=memo)
    second = await login(memo=memo)

    assert (first.server, first.insecure, first.token) == ("https://k:6443", True, "token-1")
    assert first.expiration is not None
    assert first.expiration.year == 2099
    assert second.token == "token-2", "a login after a refusal or expiry runs the plugin again"
    client = memo.leadership.client  # the fenced client every write of the Controller goes through
    assert await client.bearer_token() == "token-2", "the Controller's client holds the same token"
    await client.close()
