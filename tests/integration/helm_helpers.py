"""Running the built ``helm`` (tessera.localcluster.helmbuild) in tests: against a local cluster's
kubeconfig, or with none for ``helm lint`` and ``helm template``; and the objects of a render."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tessera.localcluster.helmbuild import ensure_helm
from tessera.manifests import load_documents

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tessera"
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance")


def helm(*args: str, kubeconfig: Path | None = None, check: bool = True,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``helm ARGS`` with its state kept out of the user's home; raises with helm's words on failure."""
    home = Path(tempfile.gettempdir()) / "tessera-helm"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    proc = subprocess.run([str(ensure_helm()), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}\n{proc.stdout[-2000:]}")
    return proc


def render(*args: str, namespace: str = "tessera-system") -> list[dict[str, Any]]:
    """The objects ``helm template`` makes of the chart (extra ARGS: values)."""
    return load_documents(helm("template", "tessera", str(CHART), "-n", namespace, *args).stdout)


def without_helm_labels(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` less the labels Helm's release adds to every object's metadata."""
    labels = obj["metadata"].get("labels")
    if labels:
        for key in HELM_LABELS:
            labels.pop(key, None)
    return obj


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
