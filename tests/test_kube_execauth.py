"""Kubeconfig users: ``exec`` credential plugins read from a kubeconfig (command relative to its
folder, env, cluster info), the ExecCredential a plugin prints (token, expiry, when to refresh,
errors that never quote the secret), and the users Tessera refuses with a clear message. The
plugin run against the real apiserver is ``tests/integration/test_kube_http.py``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.kube.execauth import ExecCredentialError, ExecPlugin, parse_exec_credential
from tessera.kube.http import UNSUPPORTED_USER_FIELDS, load_kubeconfig

V1 = "client.authentication.k8s.io/v1"
NOW = datetime(2026, 12, 4, 15, 0, tzinfo=UTC)


def kubeconfig(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    config = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "me"}}],
        "clusters": [{"name": "k", "cluster": cluster or {"server": "https://k:6443"}}],
        "users": [{"name": "me", "user": user}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_an_exec_user_becomes_a_plugin_with_its_args_env_and_a_command_relative_to_the_kubeconfig(
    tmp_path: Path,
) -> None:
    cluster = {"server": "https://k:6443", "certificate-authority-data": "Q0E=",
               "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"region": "eu"}}]}
    path = kubeconfig(tmp_path, {"exec": {"apiVersion": V1, "command": "bin/get-token", "args": ["--x", 1],
                                          "env": [{"name": "PROFILE", "value": "prod"}],
                                          "provideClusterInfo": True, "interactiveMode": "IfAvailable"}}, cluster)

    plugin = load_kubeconfig(path).exec_plugin

    assert plugin is not None
    assert plugin.command == str(tmp_path / "bin/get-token")
    assert (plugin.args, plugin.env) == (("--x", "1"), (("PROFILE", "prod"),))
    info = json.loads(plugin.exec_info())
    assert info["spec"] == {"interactive": False, "cluster": {
        "server": "https://k:6443", "certificateAuthorityData": "Q0E=", "config": {"region": "eu"}}}
    on_path = load_kubeconfig(kubeconfig(tmp_path, {"exec": {"apiVersion": V1, "command": "aws"}})).exec_plugin
    assert on_path is not None
    assert on_path.command == "aws", "a bare command is looked up on PATH"
    assert "cluster" not in json.loads(on_path.exec_info())["spec"], "only with provideClusterInfo"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}, "exec.apiVersion"),
        ({"apiVersion": V1, "command": ""}, "exec.command is empty"),
        ({"apiVersion": V1, "command": "x", "interactiveMode": "Always"}, "interactiveMode is Always"),
    ],
)
def test_an_exec_section_tessera_cannot_run_is_refused_naming_the_field(
    tmp_path: Path, section: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        load_kubeconfig(kubeconfig(tmp_path, {"exec": section}))
    assert "user 'me'" in str(raised.value)


@pytest.mark.parametrize("field", sorted(UNSUPPORTED_USER_FIELDS))
def test_unsupported_kubeconfig_users_are_refused_with_what_to_use_instead(tmp_path: Path, field: str) -> None:
    value: Any = {"name": "oidc", "config": {"id-token": "secret-id-token"}} if field == "auth-provider" else "v"
    with pytest.raises(ValueError, match=f"{field} is not supported") as raised:
        load_kubeconfig(kubeconfig(tmp_path, {field: value}))
    assert "secret-id-token" not in str(raised.value)
    assert UNSUPPORTED_USER_FIELDS[field] in str(raised.value)


def credential(status: dict[str, Any], api_version: str = V1) -> bytes:
    return json.dumps({"apiVersion": api_version, "kind": "ExecCredential", "status": status}).encode()


PLUGIN = ExecPlugin(command="get-token")


def test_a_token_with_an_expiry_is_refreshed_shortly_before_it() -> None:
    hour = parse_exec_credential(credential({"token": "t", "expirationTimestamp": "2026-12-04T16:00:00Z"}), PLUGIN, NOW)
    assert hour.expires_at == NOW + timedelta(hours=1)
    assert hour.refresh_at == hour.expires_at - timedelta(seconds=30)
    assert not hour.due(NOW + timedelta(minutes=59))
    assert hour.due(NOW + timedelta(minutes=59, seconds=30))

    short = parse_exec_credential(credential({"token": "t", "expirationTimestamp": "2026-12-04T15:00:10Z"}),
                                  PLUGIN, NOW)
    assert short.refresh_at == NOW + timedelta(seconds=8), "a fifth of a short life before its end"
    expired = parse_exec_credential(credential({"token": "t", "expirationTimestamp": "2026-12-04T14:00:00Z"}),
                                    PLUGIN, NOW)
    assert expired.due(NOW)
    forever = parse_exec_credential(credential({"token": "t"}), PLUGIN, NOW)
    assert not forever.due(NOW + timedelta(days=365)), "without an expiry: only a 401 asks again"


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (b"secret-token-as-plain-text", "printed no JSON ExecCredential"),
        (json.dumps({"kind": "Secret", "status": {"token": "secret-token"}}).encode(), "no ExecCredential object"),
        (credential({"token": "secret-token"}, api_version="client.authentication.k8s.io/v1beta1"), "answered in"),
        (credential({}), "gave no status.token"),
        (credential({"clientCertificateData": "secret-cert", "clientKeyData": "secret-key"}), "client certificate"),
        (credential({"token": "secret-token", "expirationTimestamp": "soon"}), "not RFC 3339"),
    ],
    ids=["not-json", "not-exec-credential", "other-version", "no-token", "certificate", "bad-expiry"],
)
def test_what_a_plugin_prints_wrongly_is_named_without_quoting_the_secret(output: bytes, message: str) -> None:
    with pytest.raises(ExecCredentialError, match=message) as raised:
        parse_exec_credential(output, PLUGIN, NOW)
    assert "secret" not in str(raised.value)


def test_the_plugins_token_and_env_stay_out_of_reprs(tmp_path: Path) -> None:
    token = parse_exec_credential(credential({"token": "secret-token"}), PLUGIN, NOW)
    plugin = ExecPlugin(command="x", env=(("AWS_SECRET", "secret-env"),))
    assert "secret" not in repr(token)
    assert "secret" not in repr(plugin)
