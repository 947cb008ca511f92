"""The install manifests (manifests/): generated parts stay in step with the code, the one-file
install and the kustomization hold the same parts, the pods are locked down as documented,
RBAC names only what the code calls, and images are pinned. What the apiserver makes of
them is tests/integration/test_install.py's job."""

from __future__ import annotations

import argparse
import re
import shutil
import stat
import tomllib
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

import tessera
from tessera import INSTALL_NAMESPACE
from tessera.agent.plugin.cdi import DEFAULT_CDI_DIR
from tessera.agent.plugin.server import DEFAULT_REGISTRY_DIR, PluginConfig
from tessera.dra.deviceclasses import device_classes
from tessera.dra.nics import NIC_DRIVER
from tessera.kube.claims import FENCE_LABEL, NOT_FENCE_CLAIMS
from tessera.localcluster.processes import AGENT_ENVIRONMENT
from tessera.manifests import (
    HAND_WRITTEN_PARTS,
    IMAGE_REPOSITORY,
    INSTALL_FILE,
    INSTALL_PARTS,
    load_documents,
    main,
    render_install,
    stale_files,
)

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "manifests"
EXAMPLES = ROOT / "examples" / "policies"
SRC = ROOT / "operator" / "src" / "tessera"
AGENT_SA = f"system:serviceaccount:{INSTALL_NAMESPACE}:tessera-agent"


def docs(name: str) -> list[dict[str, Any]]:
    return load_documents((MANIFESTS / name).read_text())


def install() -> list[dict[str, Any]]:
    return docs(INSTALL_FILE)


def one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in install() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} in install.yaml"
    return found[0]


def rules(kind: str, name: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = one(kind, name)["rules"]
    return out


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# -- generated files ---------------------------------------------------------------------


def test_generated_manifests_match_the_code_and_their_parts() -> None:
    stale = stale_files(MANIFESTS, EXAMPLES)
    assert stale == [], f"regenerate with: python -m tessera.manifests --write manifests/ ({stale})"


def test_check_command_reports_a_hand_edited_install_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, folder)
    shutil.copytree(EXAMPLES, tmp_path / "examples" / "policies")
    assert main(["--check", str(folder)]) == 0
    (folder / INSTALL_FILE).write_text((folder / INSTALL_FILE).read_text().replace("replicas: 2", "replicas: 3"))
    assert main(["--check", str(folder)]) == 1
    assert "install.yaml is out of date" in capsys.readouterr().out
    assert main(["--write", str(folder)]) == 0
    assert main(["--check", str(folder)]) == 0


def test_install_file_is_every_part_in_install_order() -> None:
    expected = [d for name in INSTALL_PARTS for d in docs(name)]
    assert install() == expected
    kinds = [d["kind"] for d in install()]
    assert kinds[0] == "Namespace"
    last_crd = max(i for i, k in enumerate(kinds) if k == "CustomResourceDefinition")
    assert last_crd < kinds.index("ServiceAccount"), "CRDs come before anything that could refer to them"
    assert kinds[-3:] == ["Deployment", "DaemonSet", "DaemonSet"], "workloads come last, after their accounts and RBAC"


def test_render_install_names_a_missing_part() -> None:
    with pytest.raises(ValueError, match=r"agent\.yaml"):
        render_install({name: "" for name in INSTALL_PARTS if name != "agent.yaml"})


def test_kustomization_lists_the_install_parts_in_the_same_order() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert kustomization["resources"] == list(INSTALL_PARTS)
    samples = yaml.safe_load((MANIFESTS / "samples" / "kustomization.yaml").read_text())
    assert all((MANIFESTS / "samples" / name).is_file() for name in samples["resources"])
    assert set(HAND_WRITTEN_PARTS) < set(INSTALL_PARTS)


def test_crds_in_the_install_are_the_ones_in_crds_folder() -> None:
    in_folder = sorted((yaml.safe_load(p.read_text()) for p in (ROOT / "crds").glob("*.yaml")),
                       key=lambda c: str(c["metadata"]["name"]))
    installed = sorted((d for d in install() if d["kind"] == "CustomResourceDefinition"),
                       key=lambda c: str(c["metadata"]["name"]))
    assert installed == in_folder


def test_every_namespaced_object_lives_in_the_install_namespace() -> None:
    namespaced = {"ServiceAccount", "Deployment", "DaemonSet"}
    for doc in install():
        if doc["kind"] in namespaced:
            assert doc["metadata"]["namespace"] == INSTALL_NAMESPACE, doc["metadata"]["name"]
    roles = [d for d in install() if d["kind"] in ("Role", "RoleBinding")]
    # Events about cluster-scoped objects go to `default`; the leader's Lease is in the install's;
    # the apiservers' identity Leases are read (listed, nothing more) in `kube-system`.
    assert {d["metadata"]["namespace"] for d in roles} == {"default", INSTALL_NAMESPACE, "kube-system"}
    identity = one("Role", "tessera-operator-apiserver-identity")
    assert identity["metadata"]["namespace"] == "kube-system"
    assert identity["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]}]
    assert one("PodDisruptionBudget", "tessera-operator")["metadata"]["namespace"] == INSTALL_NAMESPACE


# -- the operator Deployment -------------------------------------------------------------


def test_operator_runs_two_replicas_non_root_on_a_read_only_root() -> None:
    deployment = one("Deployment", "tessera-operator")
    spec = deployment["spec"]
    assert spec["replicas"] == 2, "a leader and a warm standby"
    # The Lease, not the rollout, keeps two from writing: a rollout may overlap (surge) but never
    # leaves fewer than two replicas, and the old leader hands its lease over as it stops.
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    budget = one("PodDisruptionBudget", "tessera-operator")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": spec["selector"]}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "tessera-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}}
    assert container["resources"]["requests"].keys() == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    assert all(v.get("hostPath") is None for v in pod.get("volumes", []))


def test_operator_probes_hit_the_health_port_it_listens_on() -> None:
    container = one("Deployment", "tessera-operator")["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = env_of(container)
    assert ports["health"] == int(env["TESSERA_HEALTH_PORT"]) == 8080
    assert ports["ready"] == int(env["TESSERA_READY_PORT"]) == 8081
    assert ports["metrics"] == int(env["TESSERA_METRICS_PORT"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ready"}
    assert container["args"] == ["operator"]
    assert "KUBECONFIG" not in env, "in the cluster the operator uses its service account"


# -- the agent DaemonSet -----------------------------------------------------------------


def agent_pod() -> dict[str, Any]:
    pod: dict[str, Any] = one("DaemonSet", "tessera-agent")["spec"]["template"]["spec"]
    return pod


def test_agent_mounts_only_the_host_paths_the_code_uses() -> None:
    pod = agent_pod()
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    (container,) = pod["containers"]
    env = env_of(container)
    expected = {
        str(DEFAULT_REGISTRY_DIR),  # registration socket
        str(PluginConfig(node_name="n").plugin_folder),  # DRA socket, checkpoint
        str(make_nic_plugin_config(env).plugin_dir),  # the NIC plugin's sockets, checkpoint, agent.pid
        str(DEFAULT_CDI_DIR),  # CDI specs
        env["TESSERA_MPS_ROOT"],  # MPS pipes, mounted into workloads by path
        str(Path(env["TESSERA_STATE_FILE"]).parent),  # the simulated hardware
    }
    assert set(host_paths.values()) == expected
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for name, path in host_paths.items():
        assert mounts[name] == path, "host paths appear at the same path inside, so CDI specs name host paths"
    assert "/dev" not in host_paths.values(), "a privileged container already sees the GPU device nodes"
    assert not {"hostNetwork", "hostIPC"} & set(pod)
    assert pod["hostPID"] is True, "the agent checks the MPS host's daemons by their pids"


def test_mps_daemons_run_in_a_pod_of_their_own_that_a_rollout_of_the_agent_leaves_alone() -> None:
    agent = agent_pod()
    assert env_of(agent["containers"][0])["TESSERA_MPS_DAEMONS"] == "host"
    daemon_set = one("DaemonSet", "tessera-mps-host")
    assert daemon_set["spec"]["updateStrategy"] == {"type": "OnDelete"}, "deleting its Pod ends every daemon"
    pod = daemon_set["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["nodeSelector"] == agent["nodeSelector"]
    assert pod["automountServiceAccountToken"] is False, "it never talks to the API"
    (container,) = pod["containers"]
    assert container["args"] == ["mps-host"]
    agent_root = env_of(agent["containers"][0])["TESSERA_MPS_ROOT"]
    assert env_of(container)["TESSERA_MPS_ROOT"] == agent_root
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {"mps": agent_root}
    assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["mps"] == agent_root


def make_nic_plugin_config(env: dict[str, Any]) -> Any:
    """The NIC plugin's config as the agent builds it from the DaemonSet's environment."""
    from tessera.cli.agent import add_arguments, make_nic_plugin_config

    with pytest.MonkeyPatch.context() as patch:  # the flags' defaults are read from the environment
        for name, value in env.items():
            if isinstance(value, str):
                patch.setenv(name, value)
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return make_nic_plugin_config(parser.parse_args([]))


def test_the_shared_nics_patch_puts_the_agent_in_the_hosts_network_and_its_hook_enters_it_by_host_pid() -> None:
    pod = agent_pod()
    assert "hostNetwork" not in pod, "off by default: the patch turns it on"
    patch = yaml.safe_load((ROOT / "e2e" / "local" / "shared-nics-agent.yaml").read_text())["spec"]["template"]["spec"]
    assert patch["hostNetwork"] is True, "shares' macvlans, classes and filters live in the host's namespace"
    assert patch["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert patch["hostPID"] is True, "the attach hook enters the agent by the pid it writes"
    (container,) = pod["containers"]
    (patched,) = patch["containers"]
    assert patched["name"] == container["name"]
    config = make_nic_plugin_config({**env_of(container), **env_of(patched)})
    assert config.hook_in_agent_namespace is True
    assert make_nic_plugin_config(env_of(container)).hook_in_agent_namespace is False
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(config.agent_pid_file.parent) in mounts
    assert str(config.checkpoint.parent) in mounts


def test_agent_runs_on_gpu_nodes_with_its_node_name_and_a_backend_switch() -> None:
    pod = agent_pod()
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["serviceAccountName"] == "tessera-agent"
    (container,) = pod["containers"]
    env = env_of(container)
    assert env["TESSERA_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["TESSERA_BACKEND"] == "nvml"
    assert env["TESSERA_SIMULATE"] == "", "empty: the switch is there to set, off by default"
    assert container["args"] == ["agent"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == int(env["TESSERA_METRICS_PORT"])


def test_only_the_agent_and_the_mps_host_are_privileged_and_root() -> None:
    privileged = []
    for doc in install():
        if doc["kind"] in ("Deployment", "DaemonSet"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container.get("securityContext", {}).get("privileged"):
                    privileged.append(doc["metadata"]["name"])
    assert privileged == ["tessera-agent", "tessera-mps-host"]
    (container,) = agent_pod()["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_every_tessera_variable_in_the_manifests_is_read_by_the_cli() -> None:
    agent_cli = (SRC / "cli" / "agent.py").read_text()
    operator_cli = (SRC / "cli" / "operator.py").read_text()
    mps_host_cli = (SRC / "cli" / "mpshost.py").read_text()
    for workload, source in (("tessera-agent", agent_cli), ("tessera-operator", operator_cli),
                             ("tessera-mps-host", mps_host_cli)):
        doc = next(d for d in install() if d["metadata"]["name"] == workload and "template" in d.get("spec", {}))
        for name in env_of(doc["spec"]["template"]["spec"]["containers"][0]):
            if name.startswith("TESSERA_"):
                suffix = name.removeprefix("TESSERA_")
                readers = (f'_env("{suffix}"', f'_env_str("{suffix}"', f'"{name}"')
                assert any(r in source for r in readers), f"{workload} sets {name}: nobody reads it"


def test_images_are_pinned_to_the_package_version() -> None:
    images = [
        c["image"]
        for d in install()
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert images == [f"{IMAGE_REPOSITORY}:{tessera.__version__}"] * 3
    run_sh = (ROOT / "e2e" / "run.sh").read_text()
    assert f"{IMAGE_REPOSITORY}:{tessera.__version__}" in run_sh


def test_sample_workload_images_have_explicit_tags() -> None:
    for path in (MANIFESTS / "samples").glob("*.yaml"):
        for doc in load_documents(path.read_text()):
            if doc.get("kind") == "Pod":
                for container in doc["spec"]["containers"]:
                    assert re.fullmatch(r"[\w./-]+:[\w.-]+", container["image"]), container["image"]
                    assert not container["image"].endswith(":latest")


# -- RBAC --------------------------------------------------------------------------------

# (api group, resource) -> (source file, the call or constant there that needs it), for every
# grant; the Kopf-only grant names Kopf's own module.
KOPF_OBSERVER = str(Path(kopf.__file__).parent / "_core" / "reactor" / "observation.py")  # absolute: SRC / it is it
OPERATOR_RESOURCES = {
    ("tessera.dev", "sharingpolicies"): [
        ("kube/objects.py", '"sharingpolicies"'), ("controller/handlers.py", "POLICIES")],
    ("tessera.dev", "sharingpolicies/status"): [
        ("kube/objects.py", '"sharingpolicies"'), ("kube/objects.py", 'subresource="status"')],
    ("tessera.dev", "networksharingpolicies"): [
        ("controller/nics.py", '"networksharingpolicies"'),
        ("controller/nics.py", "*NETWORK_POLICIES, self.policy_seen"),
    ],
    ("tessera.dev", "networksharingpolicies/status"): [
        ("controller/nics.py", "resource_path(*NETWORK_POLICIES, name, subresource=\"status\")")],
    ("tessera.dev", "nodelayouts"): [
        ("kube/objects.py", "resource_path(*LAYOUTS, name)"), ("controller/runtime.py", "*LAYOUTS")],
    ("", "nodes"): [("kube/objects.py", 'NODES = ("", "v1", "nodes")'), ("controller/runtime.py", "*NODES")],
    ("resource.k8s.io", "resourceclaims"): [
        ("kube/objects.py", '"resourceclaims"'), ("controller/handlers.py", "CLAIMS")],
    ("resource.k8s.io", "resourceslices"): [
        ("kube/objects.py", '"resourceslices"'), ("controller/runtime.py", "*SLICES")],
    ("resource.k8s.io", "deviceclasses"): [
        ("kube/objects.py", '"deviceclasses"'),
        ("controller/runtime.py", "resource_path(*DEVICE_CLASSES, device_class)"),
    ],
    ("", "pods/eviction"): [("kube/objects.py", 'subresource="eviction"')],
    ("", "pods"): [("controller/demand.py", 'PODS = ("", "v1", "pods")'), ("controller/runtime.py", "*PODS")],
    ("", "events"): [("kube/objects.py", 'resource_path("", "v1", "events"')],
    ("coordination.k8s.io", "leases"): [("kube/lease.py", '"leases"'), ("kube/lease.py", "self.client.replace(")],
    ("apiextensions.k8s.io", "customresourcedefinitions"): [(KOPF_OBSERVER, "references.CRDS")],
}
AGENT_RESOURCES = {
    ("", "nodes"): [("kube/nodelayouts.py", 'resource_path("", "v1", "nodes", name)')],
    ("tessera.dev", "nodelayouts"): [("kube/nodelayouts.py", "api.create(")],
    ("tessera.dev", "nodelayouts/status"): [("kube/nodelayouts.py", 'subresource="status"')],
    ("resource.k8s.io", "resourceclaims"): [
        ("agent/plugin/claims.py", "read_resource_claim("),
        ("kube/claims.py", "api.list("),
        ("agent/claimview.py", '"resourceclaims", self.feed'),
    ],
    ("resource.k8s.io", "resourceclaims/status"): [("kube/claimstatus.py", 'subresource="status"')],
    ("resource.k8s.io", "resourceclaims/driver"): [("kube/claimstatus.py", '"apply"')],
    ("resource.k8s.io", "resourceslices"): [("agent/nics/plugin.py", '"resourceslices"')],
}


def granted(rule_list: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rule_list:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def operator_grants() -> dict[tuple[str, str], set[str]]:
    roles = [d for d in install() if d["kind"] == "Role" and d["metadata"]["name"].startswith("tessera-operator-")]
    return granted(rules("ClusterRole", "tessera-operator") + [r for role in roles for r in role["rules"]])


@pytest.mark.parametrize(
    ("grants", "expected"),
    [(operator_grants, OPERATOR_RESOURCES), (lambda: granted(rules("ClusterRole", "tessera-agent")), AGENT_RESOURCES)],
    ids=["operator", "agent"],
)
def test_every_rbac_rule_names_a_resource_the_code_uses(
    grants: Any, expected: dict[tuple[str, str], list[tuple[str, str]]]
) -> None:
    assert set(grants()) == set(expected)
    for (_, resource), uses in expected.items():
        for name, evidence in uses:
            assert evidence in (SRC / name).read_text(), f"{resource}: {name} no longer calls {evidence}"


def test_no_rule_uses_wildcards_or_touches_secrets() -> None:
    for doc in install():
        for rule in doc.get("rules", []):
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], doc["metadata"]["name"]
            assert "secrets" not in rule["resources"]


def test_the_operator_may_only_annotate_tesseras_own_device_classes() -> None:
    rules_ = [r for r in rules("ClusterRole", "tessera-operator") if "deviceclasses" in r["resources"]]
    assert len(rules_) == 1
    assert rules_[0]["verbs"] == ["patch"], "no create, update or delete: the install owns the classes"
    assert set(rules_[0]["resourceNames"]) == {c["metadata"]["name"] for c in device_classes()}


def test_agent_cannot_write_specs_slices_or_other_objects() -> None:
    agent = granted(rules("ClusterRole", "tessera-agent"))
    no_update = "no update: the spec is the operator's"
    assert agent[("tessera.dev", "nodelayouts")] == {"get", "list", "watch", "create"}, no_update
    assert agent[("tessera.dev", "nodelayouts/status")] == {"update"}
    assert agent[("resource.k8s.io", "resourceclaims")] == {"get", "list", "watch"}, "read claims, never write them"
    fence_roles = [d for d in install() if d["kind"] == "Role" and d["metadata"]["name"] == "tessera-agent-fence"]
    assert [(d["metadata"]["namespace"], granted(d["rules"])) for d in fence_roles] == [
        (tessera.INSTALL_NAMESPACE, {("resource.k8s.io", "resourceclaims"): {"create", "patch"}})
    ], "it writes claims only in the install's namespace: its fence claim (tessera.agent.claimview)"
    assert "write_claim_fence(" in (SRC / "agent/claimview.py").read_text()
    assert agent[("resource.k8s.io", "resourceclaims/status")] == {"patch"}
    assert agent[("resource.k8s.io", "resourceclaims/driver")] == {"associated-node:patch"}
    (driver_rule,) = [r for r in rules("ClusterRole", "tessera-agent") if "resourceclaims/driver" in r["resources"]]
    assert driver_rule["resourceNames"] == [tessera.DRIVER_NAME, NIC_DRIVER], "its drivers' entries, nobody else's"
    operator = operator_grants()
    assert "nodelayouts/status" not in {r for _, r in operator}, "status is the agent's"
    assert operator[("", "events")] == {"create"}
    assert operator[("resource.k8s.io", "resourceslices")] == {"list", "watch", "create", "update", "delete"}


def test_bindings_name_the_accounts_that_the_install_creates() -> None:
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in install() if d["kind"] == "ServiceAccount"}
    assert accounts == {(INSTALL_NAMESPACE, "tessera-operator"), (INSTALL_NAMESPACE, "tessera-agent")}
    roles = {(d["kind"], d["metadata"]["name"]) for d in install() if d["kind"] in ("Role", "ClusterRole")}
    for doc in install():
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert (doc["roleRef"]["kind"], doc["roleRef"]["name"]) in roles
            for subject in doc["subjects"]:
                assert (subject["namespace"], subject["name"]) in accounts


# -- the admission policy ----------------------------------------------------------------


def test_admission_policy_binds_the_agent_account_to_its_own_nodelayout() -> None:
    policy = one("ValidatingAdmissionPolicy", "tessera-agent-writes-only-its-own-nodelayout")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [tessera.API_GROUP]
    assert set(rule["resources"]) == {"nodelayouts", "nodelayouts/status"}
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    (condition,) = policy["spec"]["matchConditions"]
    assert f'"{AGENT_SA}"' in condition["expression"]
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "request.name == variables.nodeName" in expressions
    assert "authentication.kubernetes.io/node-name" in policy["spec"]["variables"][0]["expression"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = one("ValidatingAdmissionPolicyBinding", "tessera-agent-writes-only-its-own-nodelayout")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_admission_policy_keeps_the_fence_label_off_every_claim_that_requests_a_device() -> None:
    """The operator's fresh reads of claims leave out those with the fence label: the policy
    must hold every claim write in the cluster to it, whoever writes it."""
    policy = one("ValidatingAdmissionPolicy", "tessera-fence-claims-request-no-device")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["resource.k8s.io"], ["resourceclaims"])
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert "matchConditions" not in policy["spec"], "every writer, not only the agents"
    (validation,) = policy["spec"]["validations"]
    assert f'"{FENCE_LABEL}" in object.metadata.labels' in validation["expression"]
    assert f"!{FENCE_LABEL}" == NOT_FENCE_CLAIMS
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = one("ValidatingAdmissionPolicyBinding", "tessera-fence-claims-request-no-device")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


# -- Dockerfile and e2e ------------------------------------------------------------------


def test_dockerfile_builds_a_slim_non_root_image_whose_entry_point_is_the_cli() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    froms = [line for line in lines if line.startswith("FROM ")]
    assert froms == ["FROM python:3.11-slim AS build", "FROM python:3.11-slim"]
    final = lines[lines.index("FROM python:3.11-slim"):]
    assert "USER 65532:65532" in final
    assert 'ENTRYPOINT ["tessera"]' in final
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'tessera = "tessera.cli:main"' in pyproject
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[1] == "*", "everything is left out of the build context unless named"


def test_the_runtime_image_installs_no_development_only_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {re.split(r"[=<>\[]", d)[0] for d in project["dependencies"]}
    dev_only = {re.split(r"[=<>\[]", d)[0] for extra in project["optional-dependencies"].values() for d in extra}
    assert "cryptography" in dev_only, "the local cluster's certificates need it, the operator and agent do not"
    assert not runtime & dev_only
    installs = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if "pip install" in line]
    assert installs, "the Dockerfile installs Tessera with pip"
    assert all("[" not in line for line in installs), "the image installs Tessera without extras"


def test_e2e_script_is_executable_and_uses_the_manifests_switch() -> None:
    run_sh = ROOT / "e2e" / "run.sh"
    assert run_sh.stat().st_mode & stat.S_IXUSR
    text = run_sh.read_text()
    assert "kubectl apply -f manifests/install.yaml" in text.replace("k apply", "kubectl apply")
    assert "TESSERA_BACKEND=simulated" in text
    assert "TESSERA_SIMULATE=" in text
    kind = yaml.safe_load((ROOT / "e2e" / "kind.yaml").read_text())
    images = {node["image"] for node in kind["nodes"]}
    assert len(images) == 1
    assert next(iter(images)).startswith("kindest/node:v1.36.")


def test_the_agent_runs_with_the_same_allocator_settings_everywhere() -> None:
    """The DaemonSet (manifests and chart) and the local cluster's agent processes set the same
    environment beyond the flags: glibc's fixed mmap threshold (processes.AGENT_ENVIRONMENT says why)."""
    (container,) = agent_pod()["containers"]
    env = env_of(container)
    chart = (ROOT / "charts" / "tessera" / "templates" / "agent.yaml").read_text()
    assert AGENT_ENVIRONMENT == {"MALLOC_MMAP_THRESHOLD_": "131072"}
    for name, value in AGENT_ENVIRONMENT.items():
        assert env[name] == value
        assert f'- {{name: {name}, value: "{value}"}}' in chart
