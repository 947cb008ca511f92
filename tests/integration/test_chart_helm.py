"""The Helm chart with the built ``helm`` (helm.sh/helm/v4, built into the cache on first use):
``helm lint`` passes; with default values it renders exactly the objects of manifests/ (object by
object, less Helm's own labels, the Namespace and the CRDs, which Helm installs from crds/); non-
default values change what they name and nothing else breaks; bad values are refused with the
key's path; and what it renders, default and not, is accepted by the real apiserver as a
server-side dry run. Installing on real nodes is test_install_real_nodes.py's job."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.localcluster import LocalCluster
from tessera.manifests import load_documents
from tests.integration.helm_helpers import CHART, helm, object_key, render, without_helm_labels

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

NON_DEFAULT: dict[str, Any] = {
    "image": {"repository": "registry.example.com/tessera", "tag": "9.9.9", "pullPolicy": "Always",
              "pullSecrets": ["regcred"]},
    "operator": {"logLevel": "debug", "nodeSelector": {"role": "control"}},
    "agent": {
        "logLevel": "debug", "backend": "simulated", "simulate": "2xH100-80GB",
        "simulatedDevDir": "/var/lib/tessera/dev", "sharedNics": True,
        "nodeSelector": {"gpu": "yes", "nvidia.com/gpu.present": None},  # null drops the default's key
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        "kubeletRootDir": "/var/lib/k0s/kubelet", "cdiDir": "/etc/cdi", "maxUnavailable": "20%",
    },
    "deviceClasses": {"extendedResourceName": ""},
    "grafana": {"dashboard": {"enabled": True}},
}
MONITORING: dict[str, Any] = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                                          "prometheusRule": {"enabled": True, "drainTimeout": "2h"}}}


def _values_file(tmp_path: Path, values: dict[str, Any], name: str = "values.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)}"
    return found[0]


def test_helm_lint_passes_with_default_and_non_default_values(tmp_path: Path) -> None:
    out = helm("lint", "--strict", str(CHART)).stdout
    assert "0 chart(s) failed" in out
    out = helm("lint", "--strict", str(CHART), "-f", _values_file(tmp_path, {**NON_DEFAULT, **MONITORING})).stdout
    assert "0 chart(s) failed" in out


def test_default_values_render_exactly_the_objects_of_manifests() -> None:
    chart = {object_key(o): without_helm_labels(o) for o in render()}
    manifests = {object_key(o): o for o in load_documents((ROOT / "manifests" / "install.yaml").read_text())
                 if o["kind"] not in ("Namespace", "CustomResourceDefinition")}
    assert sorted(chart) == sorted(manifests)
    for key, expected in manifests.items():
        assert chart[key] == expected, f"{key} differs between the chart and manifests/"
    crds = {o["metadata"]["name"]: o for o in load_documents((ROOT / "manifests" / "crds.yaml").read_text())}
    chart_crds = {o["metadata"]["name"]: o for p in sorted((CHART / "crds").glob("*.yaml"))
                  for o in load_documents(p.read_text())}
    assert chart_crds == crds


def test_non_default_values_change_what_they_name(tmp_path: Path) -> None:
    objects = render("-f", _values_file(tmp_path, {**NON_DEFAULT, **MONITORING}), namespace="gpu-infra")
    agent = _one(objects, "DaemonSet", "tessera-agent")
    pod = agent["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["image"] == "registry.example.com/tessera:9.9.9"
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"gpu": "yes"}
    assert pod["tolerations"] == NON_DEFAULT["agent"]["tolerations"]
    assert agent["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "20%"}
    assert env["TESSERA_LOG_LEVEL"] == "debug"
    assert (env["TESSERA_BACKEND"], env["TESSERA_SIMULATE"], env["TESSERA_SIMULATED_DEV_DIR"]) == (
        "simulated", "2xH100-80GB", "/var/lib/tessera/dev")
    # The kubelet's folders move on the host and in the container alike (the plugin tells the
    # kubelet its socket's path), and the agent is told where they are.
    assert env["TESSERA_KUBELET_REGISTRY_DIR"] == "/var/lib/k0s/kubelet/plugins_registry"
    assert env["TESSERA_KUBELET_PLUGIN_DIR"] == "/var/lib/k0s/kubelet/plugins/gpu.tessera.dev"
    assert env["TESSERA_CDI_DIR"] == "/etc/cdi"
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for name in ("plugins-registry", "plugin", "cdi"):
        assert host[name] == mounts[name]
    assert host["plugin"] == "/var/lib/k0s/kubelet/plugins/gpu.tessera.dev"
    assert host["nic-plugin"] == mounts["nic-plugin"] == "/var/lib/k0s/kubelet/plugins/nic.tessera.dev"
    # Shared NICs: the host's network and pids, and the hook that enters the agent (the shared-NICs patch).
    assert (pod["hostNetwork"], pod["hostPID"], pod["dnsPolicy"]) == (True, True, "ClusterFirstWithHostNet")
    assert env["TESSERA_NIC_ATTACH_IN_AGENT_NAMESPACE"] == "1"
    operator = _one(objects, "Deployment", "tessera-operator")
    assert operator["metadata"]["namespace"] == "gpu-infra"
    assert operator["spec"]["template"]["spec"]["nodeSelector"] == {"role": "control"}
    whole = _one(objects, "DeviceClass", "whole-gpu.tessera.dev")
    assert "extendedResourceName" not in whole["spec"]
    policy = _one(objects, "ValidatingAdmissionPolicy", "tessera-agent-writes-only-its-own-nodelayout")
    assert "system:serviceaccount:gpu-infra:tessera-agent" in policy["spec"]["matchConditions"][0]["expression"]
    bindings = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert {s["namespace"] for b in bindings for s in b["subjects"]} == {"gpu-infra"}
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert sorted(m["metadata"]["name"] for m in monitors) == ["tessera-agent", "tessera-operator"]
    assert all(m["metadata"]["labels"]["release"] == "prom" for m in monitors)
    rule = _one(objects, "PrometheusRule", "tessera")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"TesseraClaimOnMissingDevice", "TesseraPolicyDegraded", "TesseraDrainPastTimeout"} <= set(alerts)
    assert alerts["TesseraDrainPastTimeout"]["for"] == "2h"
    assert "{{ $labels.policy }}" in alerts["TesseraPolicyDegraded"]["annotations"]["summary"]
    dashboard = _one(objects, "ConfigMap", "tessera-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert yaml.safe_load(dashboard["data"]["tessera.json"])["uid"] == "tessera"


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"agent": {"logLevel": 3}}, "'/agent/logLevel': got number, want string"),
        ({"agent": {"nodeSelecter": {"gpu": "yes"}}}, "'/agent': additional properties 'nodeSelecter' not allowed"),
        ({"agent": {"backend": "cuda"}}, "'/agent/backend'"),
        ({"image": {"pullPolicy": "Sometimes"}}, "'/image/pullPolicy'"),
        ({"deviceClasses": {"extendedResourceName": "not a name"}}, "'/deviceClasses/extendedResourceName'"),
        ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "'/metrics/serviceMonitor/enabled': got string"),
        ({"tessera": {}}, "additional properties 'tessera' not allowed"),
        ({"agent": {"backend": "simulated"}}, "agent.backend=simulated needs agent.simulate"),
        ({"agent": {"simulate": "1xH100-80GB"}}, "agent.simulate names simulated GPUs: set agent.backend=simulated"),
    ],
)
def test_bad_values_are_refused_with_the_key_named(tmp_path: Path, values: dict[str, Any], named: str) -> None:
    proc = helm("template", "tessera", str(CHART), "-f", _values_file(tmp_path, values), check=False)
    assert proc.returncode != 0
    assert named in proc.stderr


def test_default_and_non_default_renders_pass_a_server_side_dry_run(cluster: LocalCluster, tmp_path: Path) -> None:
    namespace = f"helm-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        for values in ({}, NON_DEFAULT):
            rendered = helm("template", "tessera", str(CHART), "-n", namespace, "--include-crds",
                            "-f", _values_file(tmp_path, values)).stdout
            kinds = {o["kind"] for o in load_documents(rendered)}
            assert {"CustomResourceDefinition", "DaemonSet", "Deployment", "DeviceClass",
                    "ValidatingAdmissionPolicy"} <= kinds
            out = cluster.kubectl("apply", "--server-side", "--dry-run=server", "--force-conflicts",
                                  "--field-manager=helm-dry-run", "-f", "-", input=rendered, timeout=120)
            applied = [line for line in out.stdout.splitlines() if "(server dry run)" in line]
            assert len(applied) == len(load_documents(rendered)), out.stdout
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
