"""The install manifests on the real control plane, run with exactly the rights they grant.

``kubectl apply -f manifests/install.yaml`` is accepted (the Deployment and DaemonSet too;
nothing runs them here: no kubelet, no image). Then the operator runs as the
``tessera-operator`` service account and two node agents run as ``tessera-agent`` with
node-bound tokens — the tokens their DaemonSet pods would get — and the sample policies and
sample workloads of ``manifests/samples/`` go through the whole path: policies get a status,
agents report, slices are published, the scheduler allocates the samples' claims, and no log
says "forbidden". The RBAC matrix is checked with ``kubectl auth can-i --as``, and the
admission policy refuses an agent that writes another node's NodeLayout.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera import INSTALL_NAMESPACE
from tessera.agent.claimview import fence_claim_name
from tessera.kube.claims import ANSWER_ANNOTATION, ASK_ANNOTATION, FENCE_LABEL, NODE_ANNOTATION, NOT_FENCE_CLAIMS
from tessera.kube.claimstatus import ClaimGoneError, apply_claim_device_status
from tessera.kube.http import ApiError, KubeClient
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcess, TesseraProcesses
from tessera.manifests import load_documents
from tessera.models.claimcheck import ClaimCheckAnswer
from tessera.models.quantity import parse_quantity
from tests.integration.kube_helpers import (
    allocated_devices,
    apply,
    condition,
    delete_pod_now,
    get,
    get_or_none,
    node_devices,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
INSTALL = MANIFESTS / "install.yaml"
SAMPLES = MANIFESTS / "samples"
OPERATOR_SA = f"system:serviceaccount:{INSTALL_NAMESPACE}:tessera-operator"
AGENT_SA = f"system:serviceaccount:{INSTALL_NAMESPACE}:tessera-agent"
H100_NODE, H200_NODE, SPARE_NODE = "install-h100", "install-h200", "install-spare"
LAYOUTS = "nodelayouts.tessera.dev"
MISSING_GRANT = re.compile(r"forbidden|not enough permissions|\b403\b", re.IGNORECASE)
POLICY_NAMES = [doc["metadata"]["name"] for doc in load_documents((SAMPLES / "sharingpolicies.yaml").read_text())]


@dataclass(frozen=True)
class Identity:
    """A kubeconfig that authenticates with one service-account token, nothing else."""

    cluster: LocalCluster
    kubeconfig: Path

    @classmethod
    def write(cls, cluster: LocalCluster, token: str, path: Path, namespace: str | None = None) -> Identity:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": cluster.server,
                                                       "certificate-authority": str(cluster.ca_file)}}],
            "users": [{"name": path.stem, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": path.stem,
                                                       **({"namespace": namespace} if namespace else {})}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return cls(cluster, path)

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.cluster.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=input, capture_output=True, text=True, timeout=60, check=False,
        )


@dataclass
class Install:
    """The install applied, and Tessera running from it as its own service accounts."""

    operator: TesseraProcess
    agents: dict[str, TesseraProcess]
    agent_identities: dict[str, Identity]
    apply_output: str


def _token(cluster: LocalCluster, account: str, *bound: str) -> str:
    return cluster.kubectl("create", "token", account, "-n", INSTALL_NAMESPACE, "--duration=2h", *bound).stdout.strip()


def _agent_pod_token(cluster: LocalCluster, node: str) -> str:
    """The token a DaemonSet pod of the agent on ``node`` gets: bound to a pod on that node."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"tessera-agent-{node}", "namespace": INSTALL_NAMESPACE,
                     "labels": {"app.kubernetes.io/name": "tessera-agent-test"}},
        "spec": {"nodeName": node, "serviceAccountName": "tessera-agent",
                 "containers": [{"name": "agent", "image": "registry.invalid/none:0"}]},
    }
    created = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(pod)).stdout)
    return _token(cluster, "tessera-agent", "--bound-object-kind=Pod", f"--bound-object-name={pod['metadata']['name']}",
                  f"--bound-object-uid={created['metadata']['uid']}")


def _forbidden_lines(process: TesseraProcess) -> list[str]:
    text = process.log.read_text(errors="replace")
    return [line for line in text.splitlines() if MISSING_GRANT.search(line)]


def _delete_policies(cluster: LocalCluster) -> None:
    cluster.kubectl("delete", "sharingpolicies", *POLICY_NAMES, "--ignore-not-found", "--wait=false")


@pytest.fixture(scope="module")
def install(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    folder = tmp_path_factory.mktemp("install")
    applied = cluster.kubectl("apply", "--server-side", "-f", str(INSTALL))  # the README's command
    cluster.kubectl("wait", "--for=condition=Established", "crd/sharingpolicies.tessera.dev",
                    "crd/nodelayouts.tessera.dev", "--timeout=60s")

    cluster.add_node(H100_NODE, labels={"nvidia.com/gpu.present": "true", "pool": "inference"})
    cluster.add_node(H200_NODE, labels={"nvidia.com/gpu.present": "true"})
    # In its namespace, as in its pod: Kopf posts events about cluster-scoped objects there.
    operator_id = Identity.write(cluster, _token(cluster, "tessera-operator"), folder / "operator.kubeconfig",
                                 namespace=INSTALL_NAMESPACE)
    agent_ids = {
        node: Identity.write(cluster, _agent_pod_token(cluster, node), folder / f"agent-{node}.kubeconfig")
        for node in (H100_NODE, H200_NODE)
    }
    runners = [TesseraProcesses(operator_id, folder)]  # the processes get this kubeconfig and nothing else
    operator = runners[0].operator(env={"TESSERA_LEASE_NAMESPACE": INSTALL_NAMESPACE})  # as the Deployment's
    agents = {}
    for node, simulate in ((H100_NODE, "1xH100-80GB"), (H200_NODE, "1xH200-141GB")):
        runners.append(TesseraProcesses(agent_ids[node], folder))
        agents[node] = runners[-1].agent(node, simulate)
    try:
        yield Install(operator, agents, agent_ids, applied.stdout)
    finally:
        # Leave the shared cluster as we found it: the operator lifts its finalizers while it runs.
        _delete_policies(cluster)
        for name in POLICY_NAMES:
            cluster.kubectl("wait", "--for=delete", f"sharingpolicy/{name}", "--timeout=30s", check=False)
        cluster.kubectl("delete", "pods", "-n", INSTALL_NAMESPACE, "-l", "app.kubernetes.io/name=tessera-agent-test",
                        "--grace-period=0", "--force", "--wait=false", check=False)
        cluster.kubectl("delete", "nodes", H100_NODE, H200_NODE, SPARE_NODE, "--ignore-not-found", check=False)
        for runner in reversed(runners):
            runner.stop_all()


# -- what the apiserver accepts ----------------------------------------------------------


def test_every_object_of_the_install_is_accepted(cluster: LocalCluster, install: Install) -> None:
    for doc in load_documents(INSTALL.read_text()):
        kind, meta = doc["kind"], doc["metadata"]
        group = doc["apiVersion"].rpartition("/")[0]
        args = [f"{kind.lower()}.{group}" if group else kind.lower(), meta["name"]]
        if "namespace" in meta:
            args += ["-n", meta["namespace"]]
        assert get_or_none(cluster, *args) is not None, f"{kind}/{meta['name']} is not in the cluster"
    deployment = get(cluster, "deployment", "tessera-operator", "-n", INSTALL_NAMESPACE)
    assert deployment["spec"]["replicas"] == 2  # a leader and a warm standby
    daemonset = get(cluster, "daemonset", "tessera-agent", "-n", INSTALL_NAMESPACE)
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] is True
    assert "deployment.apps/tessera-operator" in install.apply_output
    assert "daemonset.apps/tessera-agent" in install.apply_output
    # A client-side apply works too (the last-applied annotations fit); raises on any refusal.
    again = cluster.kubectl("apply", "--dry-run=server", "-f", str(INSTALL))
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/tessera-agent-writes-only-its-own-nodelayout" in (
        again.stdout
    )


def test_kustomization_builds_the_same_objects_as_install_yaml(cluster: LocalCluster) -> None:
    built = load_documents(cluster.kubectl("kustomize", str(MANIFESTS)).stdout)

    def key(doc: dict[str, Any]) -> tuple[str, str, str]:
        return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]

    assert sorted(built, key=key) == sorted(load_documents(INSTALL.read_text()), key=key)


def test_the_overlay_without_extended_resource_drops_only_that_field(cluster: LocalCluster) -> None:
    built = load_documents(cluster.kubectl("kustomize", str(ROOT / "overlays" / "without-extended-resource")).stdout)
    expected = load_documents(INSTALL.read_text())
    whole = [d for d in expected if d["kind"] == "DeviceClass" and d["metadata"]["name"] == "whole-gpu.tessera.dev"]
    assert [d["spec"].pop("extendedResourceName") for d in whole] == ["nvidia.com/gpu"]

    def key(doc: dict[str, Any]) -> tuple[str, str, str]:
        return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]

    assert sorted(built, key=key) == sorted(expected, key=key)


def test_sample_policies_and_workloads_pass_admission(cluster: LocalCluster, namespace: str) -> None:
    cluster.kubectl("apply", "--dry-run=server", "-f", str(SAMPLES / "sharingpolicies.yaml"))
    for sample in ("inference-mig-3g.yaml", "inference-shared-10gi.yaml"):
        out = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(SAMPLES / sample))
        assert "(server dry run)" in out.stdout


# -- RBAC --------------------------------------------------------------------------------

# (who, verb, resource, extra kubectl args, allowed)
RBAC_MATRIX = [
    (OPERATOR_SA, "list", "sharingpolicies.tessera.dev", [], True),
    (OPERATOR_SA, "watch", "sharingpolicies.tessera.dev", [], True),
    (OPERATOR_SA, "patch", "sharingpolicies.tessera.dev", [], True),
    (OPERATOR_SA, "patch", "sharingpolicies.tessera.dev", ["--subresource=status"], True),
    (OPERATOR_SA, "patch", "nodelayouts.tessera.dev", [], True),
    (OPERATOR_SA, "watch", "nodelayouts.tessera.dev", [], True),
    (OPERATOR_SA, "watch", "nodes", [], True),
    (OPERATOR_SA, "watch", "resourceclaims.resource.k8s.io", ["--all-namespaces"], True),
    (OPERATOR_SA, "create", "resourceslices.resource.k8s.io", [], True),
    (OPERATOR_SA, "update", "resourceslices.resource.k8s.io", [], True),
    (OPERATOR_SA, "delete", "resourceslices.resource.k8s.io", [], True),
    (OPERATOR_SA, "create", "pods", ["--subresource=eviction", "-n", "team-a"], True),
    (OPERATOR_SA, "create", "events", ["-n", "default"], True),
    # Events go on claims in their own namespaces (adaptive recuts, claims on missing devices)
    (OPERATOR_SA, "create", "events", ["-n", "team-a"], True),
    (OPERATOR_SA, "create", "leases.coordination.k8s.io", ["-n", INSTALL_NAMESPACE], True),
    (OPERATOR_SA, "update", "leases.coordination.k8s.io/tessera-operator", ["-n", INSTALL_NAMESPACE], True),
    (OPERATOR_SA, "watch", "leases.coordination.k8s.io/tessera-operator", ["-n", INSTALL_NAMESPACE], True),
    (OPERATOR_SA, "update", "leases.coordination.k8s.io/kube-scheduler", ["-n", "kube-system"], False),
    (OPERATOR_SA, "update", "leases.coordination.k8s.io/other", ["-n", INSTALL_NAMESPACE], False),
    (OPERATOR_SA, "watch", "customresourcedefinitions.apiextensions.k8s.io", [], True),
    (OPERATOR_SA, "create", "sharingpolicies.tessera.dev", [], False),
    (OPERATOR_SA, "delete", "sharingpolicies.tessera.dev", [], False),
    (OPERATOR_SA, "update", "nodelayouts.tessera.dev", ["--subresource=status"], False),
    (OPERATOR_SA, "create", "nodelayouts.tessera.dev", [], False),
    (OPERATOR_SA, "delete", "nodelayouts.tessera.dev", [], False),
    (OPERATOR_SA, "patch", "nodes", [], False),
    (OPERATOR_SA, "delete", "pods", ["-n", "team-a"], False),
    (OPERATOR_SA, "update", "resourceclaims.resource.k8s.io", ["--subresource=status", "-n", "team-a"], False),
    # Its answers to the agents' claim checks, on their fence claims; no other claim.
    (OPERATOR_SA, "patch", "resourceclaims.resource.k8s.io", ["-n", INSTALL_NAMESPACE], True),
    (OPERATOR_SA, "patch", "resourceclaims.resource.k8s.io", ["-n", "team-a"], False),
    (OPERATOR_SA, "create", "resourceclaims.resource.k8s.io", ["-n", INSTALL_NAMESPACE], False),
    (OPERATOR_SA, "create", "deviceclasses.resource.k8s.io", [], False),
    (OPERATOR_SA, "get", "secrets", ["-n", INSTALL_NAMESPACE], False),
    (AGENT_SA, "get", "nodes", [], True),
    (AGENT_SA, "get", "nodelayouts.tessera.dev", [], True),
    (AGENT_SA, "watch", "nodelayouts.tessera.dev", [], True),
    (AGENT_SA, "create", "nodelayouts.tessera.dev", [], True),
    (AGENT_SA, "update", "nodelayouts.tessera.dev", ["--subresource=status"], True),
    (AGENT_SA, "get", "resourceclaims.resource.k8s.io", ["-n", "team-a"], True),
    (AGENT_SA, "list", "nodes", [], False),
    (AGENT_SA, "patch", "nodes", [], False),
    (AGENT_SA, "update", "nodelayouts.tessera.dev", [], False),
    (AGENT_SA, "patch", "nodelayouts.tessera.dev", [], False),
    (AGENT_SA, "delete", "nodelayouts.tessera.dev", [], False),
    (AGENT_SA, "patch", "nodelayouts.tessera.dev", ["--subresource=status"], False),
    (AGENT_SA, "create", "resourceslices.resource.k8s.io", [], False),
    (AGENT_SA, "list", "resourceclaims.resource.k8s.io", ["--all-namespaces"], True),
    (AGENT_SA, "watch", "resourceclaims.resource.k8s.io", ["--all-namespaces"], True),  # its fence claim (by name)
    (AGENT_SA, "create", "resourceclaims.resource.k8s.io", ["-n", INSTALL_NAMESPACE], True),  # its fence claim
    (AGENT_SA, "patch", "resourceclaims.resource.k8s.io", ["-n", INSTALL_NAMESPACE], True),
    (AGENT_SA, "create", "resourceclaims.resource.k8s.io", ["-n", "team-a"], False),
    (AGENT_SA, "patch", "resourceclaims.resource.k8s.io", ["-n", "team-a"], False),
    (AGENT_SA, "update", "resourceclaims.resource.k8s.io", ["--subresource=status", "-n", "team-a"], False),
    (AGENT_SA, "patch", "resourceclaims.resource.k8s.io", ["--subresource=status", "-n", "team-a"], True),
    (AGENT_SA, "associated-node:patch", "resourceclaims.resource.k8s.io/gpu.tessera.dev",
     ["--subresource=driver", "-n", "team-a"], True),
    (AGENT_SA, "arbitrary-node:patch", "resourceclaims.resource.k8s.io/gpu.tessera.dev",
     ["--subresource=driver", "-n", "team-a"], False),
    (AGENT_SA, "associated-node:patch", "resourceclaims.resource.k8s.io/gpu.nvidia.com",
     ["--subresource=driver", "-n", "team-a"], False),
    (AGENT_SA, "patch", "resourceclaims.resource.k8s.io", ["--subresource=binding", "-n", "team-a"], False),
    (AGENT_SA, "list", "sharingpolicies.tessera.dev", [], False),
    (AGENT_SA, "create", "pods", ["-n", INSTALL_NAMESPACE], False),
    (AGENT_SA, "get", "secrets", ["-n", INSTALL_NAMESPACE], False),
]


def test_rbac_matrix(cluster: LocalCluster, install: Install) -> None:
    wrong = []
    for who, verb, resource, extra, allowed in RBAC_MATRIX:
        out = cluster.kubectl("auth", "can-i", verb, resource, *extra, f"--as={who}", check=False)
        answer = out.stdout.strip()
        assert answer in ("yes", "no"), f"kubectl auth can-i {verb} {resource}: {out.stderr}"
        if (answer == "yes") != allowed:
            wrong.append(f"{who.rpartition(':')[2]} {verb} {resource} {' '.join(extra)}: {answer}")
    assert wrong == []


# -- running as the service accounts -----------------------------------------------------


async def test_operator_and_agents_run_the_samples_with_only_the_granted_rights(
    cluster: LocalCluster, install: Install, namespace: str
) -> None:
    cluster.kubectl("apply", "-f", str(SAMPLES / "sharingpolicies.yaml"))
    for sample in ("inference-mig-3g.yaml", "inference-shared-10gi.yaml"):
        cluster.kubectl("apply", "-n", namespace, "-f", str(SAMPLES / sample))

    def ready(name: str) -> dict[str, Any] | None:
        body = get_or_none(cluster, "sharingpolicy", name)
        c = condition(body, "Ready")
        return body if c is not None and c["status"] == "True" and body and body["status"].get("gpus") else None

    h100 = await wait_for(lambda: ready("h100-inference"), timeout=90, message="h100-inference Ready, set by the SA")
    await wait_for(lambda: ready("big-memory-balanced"), timeout=90, message="big-memory-balanced Ready")
    assert h100["status"]["gpus"] == 1, "the H100 of the node in pool: inference"

    mig = await wait_for(lambda: allocated_devices(cluster, namespace, "vllm-mig-3g"), timeout=90,
                         message="the 3g MIG sample to be allocated")
    share = await wait_for(lambda: allocated_devices(cluster, namespace, "vllm-shared-10gi"), timeout=90,
                           message="the 10Gi share sample to be allocated")
    assert mig[0]["pool"] == H200_NODE
    profile = node_devices(cluster, H200_NODE)[mig[0]["device"]]["attributes"]["migProfile"]["string"]
    assert profile == "3g.71gb"
    assert share[0]["pool"] == H100_NODE
    assert parse_quantity(share[0]["consumedCapacity"]["memory"]) == 10 * 2**30

    for node in (H100_NODE, H200_NODE):
        layout = get(cluster, LAYOUTS, node)
        assert layout["status"]["gpus"], f"{node}'s agent reported through its own node-bound token"
    for process in (install.operator, *install.agents.values()):
        assert process.alive(), process.tail()
        assert _forbidden_lines(process) == [], f"{process.name} hit a missing grant:\n{process.tail()}"
    for pod_name in ("vllm-mig-3g", "vllm-shared-10gi"):
        delete_pod_now(cluster, namespace, pod_name)


# -- the admission policy ----------------------------------------------------------------


def _replace_status(identity: Identity, cluster: LocalCluster, node: str) -> subprocess.CompletedProcess[str]:
    """Write ``node``'s NodeLayout status back unchanged, the way the agent writes (update)."""
    body = get(cluster, LAYOUTS, node)
    return identity.kubectl("replace", "--subresource=status", "-f", "-", input=json.dumps(body))


async def test_admission_lets_an_agent_write_only_its_own_nodelayout(cluster: LocalCluster, install: Install) -> None:
    await wait_for(lambda: (get_or_none(cluster, LAYOUTS, H200_NODE) or {}).get("status"), timeout=60,
                   message=f"{H200_NODE}'s NodeLayout status")
    h100_agent = install.agent_identities[H100_NODE]

    own = _replace_status(h100_agent, cluster, H100_NODE)
    assert own.returncode == 0, own.stderr

    other = _replace_status(h100_agent, cluster, H200_NODE)
    assert other.returncode != 0
    assert "ValidatingAdmissionPolicy 'tessera-agent-writes-only-its-own-nodelayout'" in other.stderr
    message = f"the tessera-agent of node {H100_NODE} may write only NodeLayout {H100_NODE}, not {H200_NODE}"
    assert message in other.stderr

    unbound = Identity.write(cluster, _token(cluster, "tessera-agent"), h100_agent.kubeconfig.with_name("unbound.kc"))
    refused = _replace_status(unbound, cluster, H100_NODE)
    assert refused.returncode != 0
    assert "this token names no node" in refused.stderr


async def test_admission_lets_an_agent_write_only_its_own_fence_claim_and_never_an_answer(
    cluster: LocalCluster, install: Install
) -> None:
    """An agent asks only about its own node, on its own fence claim, and cannot write the
    operator's answer: else it could let another node destroy a device a claim holds."""
    agent = install.agent_identities[H100_NODE]
    for node in (H100_NODE, H200_NODE):  # each agent makes its fence claim as it starts
        await wait_for(lambda n=node: get_or_none(cluster, "resourceclaim", fence_claim_name(n), "-n",
                                                  INSTALL_NAMESPACE), timeout=60, message=f"{node}'s fence claim")

    def annotate(fence_of: str, notes: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return agent.kubectl("patch", "resourceclaim", fence_claim_name(fence_of), "-n", INSTALL_NAMESPACE,
                             "--type=merge", "-p", json.dumps({"metadata": {"annotations": notes}}))

    own = annotate(H100_NODE, {ASK_ANNOTATION: "test-1", NODE_ANNOTATION: H100_NODE})
    assert own.returncode == 0, own.stderr
    asked_by_h100 = {ASK_ANNOTATION: "test-2", NODE_ANNOTATION: H100_NODE}
    asks_about_h200 = {ASK_ANNOTATION: "test-3", NODE_ANNOTATION: H200_NODE}
    answer = {ANSWER_ANNOTATION: ClaimCheckAnswer("forged-1", H100_NODE, {}).encode()}
    refusals = [
        ("may write only its fence claim", annotate(H200_NODE, asked_by_h100)),
        ("may ask only about its own node", annotate(H100_NODE, asks_about_h200)),
        ("the operator writes the answer to a claim check, not the agent", annotate(H100_NODE, answer)),
    ]
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}
    meta = {"name": fence_claim_name(H100_NODE) + "-x", "namespace": INSTALL_NAMESPACE,
            "annotations": {NODE_ANNOTATION: H100_NODE}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
             "spec": {"devices": {"requests": [request]}}}
    created = agent.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(claim))
    refusals.append(("may write only its fence claim", created))
    for message, refused in refusals:
        assert refused.returncode != 0, message
        assert "tessera-agent-writes-only-its-own-fence-claim" in refused.stderr, refused.stderr
        assert message in refused.stderr, refused.stderr


async def test_fence_claims_carry_their_label_which_no_claim_requesting_a_device_may_carry(
    cluster: LocalCluster, install: Install, namespace: str
) -> None:
    """The operator's fresh reads leave out the fence claims by their label: each agent's
    carries it, a read by that selector has every other claim, and admission refuses the label
    on a claim that requests a device, from anyone (here the cluster's admin)."""
    for node in (H100_NODE, H200_NODE):
        fence = await wait_for(
            lambda n=node: get_or_none(cluster, "resourceclaim", fence_claim_name(n), "-n", INSTALL_NAMESPACE),
            timeout=60, message=f"{node}'s fence claim")
        assert fence["metadata"]["labels"][FENCE_LABEL] == "true"
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}

    def claim(name: str, labels: dict[str, str], requests: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace, "labels": labels},
                "spec": {"devices": {"requests": requests} if requests else {}}}

    apply(cluster, claim("plain", {}, [request]))
    read = get(cluster, "resourceclaims", "-A", "-l", NOT_FENCE_CLAIMS)["items"]
    names = {(c["metadata"]["namespace"], c["metadata"]["name"]) for c in read}
    assert (namespace, "plain") in names
    assert not any(n.startswith("tessera-fence-") for _, n in names), "no fence claim in the operator's read"

    hidden = cluster.kubectl("create", "-f", "-", input=json.dumps(claim("hidden", {FENCE_LABEL: "true"}, [request])),
                             check=False)
    assert hidden.returncode != 0
    assert "tessera-fence-claims-request-no-device" in hidden.stderr, hidden.stderr
    relabelled = cluster.kubectl("label", "resourceclaim", "plain", "-n", namespace, f"{FENCE_LABEL}=true",
                                 check=False)
    assert relabelled.returncode != 0, "nor can the label be added later"
    assert "may request no device" in relabelled.stderr, relabelled.stderr
    empty = cluster.kubectl("create", "-f", "-", input=json.dumps(claim("empty", {FENCE_LABEL: "true"}, [])),
                            check=False)
    assert empty.returncode == 0, empty.stderr


async def test_admission_lets_an_agent_create_only_its_own_empty_nodelayout(
    cluster: LocalCluster, install: Install
) -> None:
    node = cluster.add_node(SPARE_NODE)
    spare = Identity.write(
        cluster,
        _token(cluster, "tessera-agent", "--bound-object-kind=Node", f"--bound-object-name={SPARE_NODE}",
               f"--bound-object-uid={node['metadata']['uid']}"),
        install.agent_identities[H100_NODE].kubeconfig.with_name("spare.kc"),
    )
    gpus = get(cluster, LAYOUTS, H100_NODE)["spec"]["gpus"]
    assert gpus, "the operator has written a layout to copy"

    def layout(name: str, spec_gpus: list[Any]) -> str:
        return json.dumps({"apiVersion": "tessera.dev/v1alpha1", "kind": "NodeLayout",
                           "metadata": {"name": name}, "spec": {"gpus": spec_gpus}})

    foreign = spare.kubectl("create", "-f", "-", input=layout(H100_NODE + "-x", []))
    assert foreign.returncode != 0
    assert f"may write only NodeLayout {SPARE_NODE}, not {H100_NODE}-x" in foreign.stderr
    with_spec = spare.kubectl("create", "-f", "-", input=layout(SPARE_NODE, gpus))
    assert with_spec.returncode != 0
    assert "an agent creates its NodeLayout with an empty spec" in with_spec.stderr
    own = spare.kubectl("create", "-f", "-", input=layout(SPARE_NODE, []))
    assert own.returncode == 0, own.stderr
    cluster.kubectl("delete", LAYOUTS, SPARE_NODE)


# -- claim device status -----------------------------------------------------------------


def _claim_allocated_on(cluster: LocalCluster, namespace: str, node: str) -> dict[str, Any]:
    """A claim whose allocation (written as the scheduler would) names a device of ``node``."""
    name = f"on-{node}"
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "whole-gpu.tessera.dev"}}]}},
    }))
    claim = get(cluster, "resourceclaim", name, "-n", namespace)
    claim["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.tessera.dev", "pool": node, "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
    }}
    cluster.kubectl("replace", "--subresource=status", "-f", "-", input=json.dumps(claim))
    return get(cluster, "resourceclaim", name, "-n", namespace)


async def test_an_agent_writes_device_status_only_on_claims_allocated_on_its_own_node(
    cluster: LocalCluster, install: Install, namespace: str
) -> None:
    mine = _claim_allocated_on(cluster, namespace, H100_NODE)
    theirs = _claim_allocated_on(cluster, namespace, H200_NODE)
    entry = {"driver": "gpu.tessera.dev", "pool": H100_NODE, "device": "gpu-0",
             "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
                             "lastTransitionTime": "2026-01-01T00:00:00Z"}],
             "data": {"uuid": "GPU-0"}}
    api = KubeClient.from_environment(str(install.agent_identities[H100_NODE].kubeconfig))
    async with api:
        await apply_claim_device_status(api, namespace, mine["metadata"]["name"], mine["metadata"]["uid"],
                                        f"gpu.tessera.dev/{H100_NODE}", [entry])
        written = get(cluster, "resourceclaim", mine["metadata"]["name"], "-n", namespace)["status"]
        assert [(d["device"], d["data"]) for d in written["devices"]] == [("gpu-0", {"uuid": "GPU-0"})]
        assert written["allocation"] == mine["status"]["allocation"], "the allocation is untouched"

        other = {**entry, "pool": H200_NODE}
        with pytest.raises(ApiError) as refused:
            await apply_claim_device_status(api, namespace, theirs["metadata"]["name"], theirs["metadata"]["uid"],
                                            f"gpu.tessera.dev/{H100_NODE}", [other])
        # The per-driver check runs with validation: a refused grant is a Forbidden field error (422).
        assert refused.value.status == 422
        message = refused.value.message
        assert 'changing status.devices requires resource="resourceclaims/driver"' in message, message
        assert "arbitrary-node:patch" in message, "another node's claim: only arbitrary-node would do"

        with pytest.raises(ClaimGoneError):  # the same name, another claim: never written
            await apply_claim_device_status(api, namespace, mine["metadata"]["name"], "00000000-0000-0000-0000-0",
                                            f"gpu.tessera.dev/{H100_NODE}", [])
        await apply_claim_device_status(api, namespace, mine["metadata"]["name"], mine["metadata"]["uid"],
                                        f"gpu.tessera.dev/{H100_NODE}", [])
    cleared = get(cluster, "resourceclaim", mine["metadata"]["name"], "-n", namespace)["status"]
    assert cleared.get("devices", []) == []
    assert cleared["allocation"] == mine["status"]["allocation"]
