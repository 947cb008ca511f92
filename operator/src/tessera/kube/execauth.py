"""Kubeconfig ``exec`` credential plugins: run the command a kubeconfig user names and read the
bearer token it prints, the way kubectl does for EKS (``aws eks get-token``), GKE
(``gke-gcloud-auth-plugin``), AKS (``kubelogin``) and others.

The protocol is ``client.authentication.k8s.io/v1`` (``v1beta1`` has the same shape and is
accepted too): the plugin gets ``KUBERNETES_EXEC_INFO`` (an ExecCredential whose ``spec`` says
we are not interactive, and the cluster when the kubeconfig sets ``provideClusterInfo``), and
prints an ExecCredential whose ``status`` holds a ``token`` and optionally an
``expirationTimestamp``. ``ExecToken.refresh_at`` is when to run the plugin again: a little
before the expiry (30 s, or a fifth of the token's life if that is shorter). A 401 answer also
means "run it again" (``tessera.kube.http.KubeClient`` does that once per failed request).

Not supported, with a clear error: a plugin that prints a client certificate instead of a token,
``interactiveMode: Always`` (Tessera never has a terminal to offer), the removed ``v1alpha1``.
The plugin's output is a secret: it never appears in a repr, a log or an error message.

``ExecPlugin.from_kubeconfig`` and ``parse_exec_credential`` are pure; ``run_exec_plugin`` runs the
command. Not for: the other ways a kubeconfig names a user (``tessera.kube.http.load_kubeconfig``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
REFRESH_BEFORE_EXPIRY = timedelta(seconds=30)
EXEC_TIMEOUT_SECONDS = 60.0
# kubeconfig cluster field -> the ExecCredential's spec.cluster field (provideClusterInfo)
CLUSTER_FIELDS = {"server": "server", "tls-server-name": "tlsServerName",
                  "insecure-skip-tls-verify": "insecureSkipTLSVerify",
                  "certificate-authority-data": "certificateAuthorityData", "proxy-url": "proxyURL"}


class ExecCredentialError(Exception):
    """The plugin could not be run, failed, or printed something that is not a usable token."""


@dataclass(frozen=True)
class ExecPlugin:
    """What a kubeconfig user's ``exec`` section says to run."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may carry secrets
    api_version: str = EXEC_API_VERSIONS[0]
    install_hint: str = ""
    cluster: Mapping[str, Any] | None = field(default=None, repr=False)  # given to the plugin: provideClusterInfo

    @classmethod
    def from_kubeconfig(cls, section: Mapping[str, Any], *, folder: Path, cluster: Mapping[str, Any],
                        where: str) -> ExecPlugin:
        """The plugin of a kubeconfig user's ``exec`` section; ``where`` names the user in errors.
        A command with a ``/`` in it is relative to the kubeconfig's folder, as kubectl reads it."""
        api_version = str(section.get("apiVersion") or "")
        if api_version not in EXEC_API_VERSIONS:
            raise ValueError(
                f"{where}: exec.apiVersion {api_version!r} is not supported: use "
                f"{' or '.join(EXEC_API_VERSIONS)} (v1alpha1 was removed from Kubernetes)"
            )
        command = str(section.get("command") or "")
        if not command:
            raise ValueError(f"{where}: exec.command is empty: name the credential plugin to run")
        if "/" in command and not Path(command).is_absolute():
            command = str(folder / command)
        if section.get("interactiveMode") == "Always":
            raise ValueError(
                f"{where}: exec.interactiveMode is Always, but Tessera never runs the plugin on a terminal: "
                "use a plugin mode that needs no input (IfAvailable or Never), e.g. a cached login"
            )
        env = []
        for item in section.get("env") or []:
            if not isinstance(item, Mapping) or "name" not in item:
                raise ValueError(f"{where}: exec.env entries are {{name, value}} pairs")
            env.append((str(item["name"]), str(item.get("value", ""))))
        given: dict[str, Any] | None = None
        if section.get("provideClusterInfo"):
            given = {name: cluster[key] for key, name in CLUSTER_FIELDS.items() if key in cluster}
            extension = next((e.get("extension") for e in cluster.get("extensions") or []
                              if e.get("name") == "client.authentication.k8s.io/exec"), None)
            if extension is not None:
                given["config"] = extension
        return cls(command=command, args=tuple(str(a) for a in section.get("args") or []), env=tuple(env),
                   api_version=api_version, install_hint=str(section.get("installHint") or ""), cluster=given)

    def exec_info(self) -> str:
        """``KUBERNETES_EXEC_INFO``: what the plugin learns of the request."""
        spec: dict[str, Any] = {"interactive": False}
        if self.cluster is not None:
            spec["cluster"] = dict(self.cluster)
        return json.dumps({"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec})


@dataclass(frozen=True)
class ExecToken:
    """A token a plugin printed, and when to ask for a new one (None: only after a 401)."""

    token: str = field(repr=False)
    expires_at: datetime | None = None
    refresh_at: datetime | None = None

    def due(self, now: datetime) -> bool:
        return self.refresh_at is not None and now >= self.refresh_at


def parse_exec_credential(output: bytes, plugin: ExecPlugin, now: datetime) -> ExecToken:
    """The token of an ExecCredential the plugin printed. Errors never quote the output."""
    try:
        credential = json.loads(output)
    except ValueError:
        raise ExecCredentialError(f"credential plugin {plugin.command} printed no JSON ExecCredential") from None
    if not isinstance(credential, dict) or credential.get("kind") != "ExecCredential":
        raise ExecCredentialError(f"credential plugin {plugin.command} printed no ExecCredential object")
    if credential.get("apiVersion") != plugin.api_version:
        raise ExecCredentialError(
            f"credential plugin {plugin.command} answered in {credential.get('apiVersion')!r}, "
            f"the kubeconfig asked for {plugin.api_version!r}"
        )
    status = credential.get("status") or {}
    token = status.get("token")
    if not token:
        if status.get("clientCertificateData"):
            raise ExecCredentialError(
                f"credential plugin {plugin.command} gave a client certificate; Tessera takes only tokens from "
                "exec plugins: configure the plugin to issue a token, or put the certificate in the kubeconfig"
            )
        raise ExecCredentialError(f"credential plugin {plugin.command} gave no status.token")
    expires_at = None
    refresh_at = None
    if stamp := status.get("expirationTimestamp"):
        try:
            expires_at = datetime.fromisoformat(str(stamp))
        except ValueError:
            raise ExecCredentialError(
                f"credential plugin {plugin.command}: status.expirationTimestamp {stamp!r} is not RFC 3339"
            ) from None
        if expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=UTC)
        lifetime = max(expires_at - now, timedelta(0))
        refresh_at = expires_at - min(REFRESH_BEFORE_EXPIRY, lifetime / 5)
    return ExecToken(token=str(token), expires_at=expires_at, refresh_at=refresh_at)


async def run_exec_plugin(plugin: ExecPlugin, timeout_s: float = EXEC_TIMEOUT_SECONDS) -> ExecToken:
    """Run the plugin once (no terminal: stdin is empty) and read its token."""
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": plugin.exec_info()}
    hint = f" ({plugin.install_hint.strip()})" if plugin.install_hint.strip() else ""
    try:
        process = await asyncio.create_subprocess_exec(
            plugin.command, *plugin.args, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
    except OSError as error:
        raise ExecCredentialError(f"cannot run credential plugin {plugin.command}: {error.strerror}{hint}") from None
    try:
        output, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise ExecCredentialError(
            f"credential plugin {plugin.command} did not answer within {timeout_s:.0f} s"
        ) from None
    if process.returncode != 0:
        said = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise ExecCredentialError(
            f"credential plugin {plugin.command} failed with exit status {process.returncode}: {said[0][:300]}{hint}"
        )
    return parse_exec_credential(output, plugin, datetime.now(UTC))

