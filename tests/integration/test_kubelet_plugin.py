"""The kubelet plugin, driven the way the kubelet drives it, for claims that the real
kube-scheduler allocated against the slices Tessera publishes for a simulated GPU node.

The node has four simulated H100s: a static MIG layout, an MPS-shared GPU, a DynamicMIG GPU
and a whole GPU. Their NodeLayout status is built by the agent's own code and published with
the operator's own slice builder; Pods with ResourceClaimTemplates are scheduled; then this
test plays the kubelet: it finds the registration socket, registers the plugin, and calls
NodePrepareResources / NodeUnprepareResources on the DRA socket the plugin names."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from tessera import INSTALL_NAMESPACE
from tessera.agent.backends.base import GpuInfo
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.claimview import ClaimView
from tessera.agent.plugin import KubeClaimReader, KubeletPlugin, PluginConfig
from tessera.agent.plugin.cdi import spec_file_name
from tessera.agent.plugin.checkpoint import load_checkpoint
from tessera.agent.plugin.claims import ClaimRef, KubeClaimStatusWriter
from tessera.agent.plugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from tessera.agent.plugin.server import status_field_manager
from tessera.agent.status import gpu_status
from tessera.dra.deviceclasses import device_classes
from tessera.dra.slices import NodeRef, build_node_slices
from tessera.kube.http import KubeClient
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim
from tessera.models.devices import DeviceKind, parse_device_name
from tessera.models.layout import GpuLayout, PlacedInstance
from tessera.models.policy import MpsSpec, Strategy
from tests.integration.kube_helpers import apply, claim_of, get
from tests.plugin_helpers import STATIC_MIG, PluginDirs, make_backend, short_tmp_dir

pytestmark = pytest.mark.integration

NODE = "plugin-node-1"
DRIVER = "gpu.tessera.dev"
ATTR = f'device.attributes["{DRIVER}"]'


def _desired(gpu: GpuInfo) -> GpuLayout | None:
    """The layout the operator would have asked for, so the status says which strategy is in force."""
    if gpu.index == 0:
        instances = [PlacedInstance(profile=p, start=s) for p, s in STATIC_MIG]
        return GpuLayout(uuid=gpu.uuid, strategy=Strategy.MIG, mig_instances=instances)
    if gpu.index == 1:
        return GpuLayout(uuid=gpu.uuid, strategy=Strategy.MPS, mps=MpsSpec())
    if gpu.index == 2:
        return GpuLayout(uuid=gpu.uuid, strategy=Strategy.DYNAMIC_MIG)
    return None


def _allocated_claim(cluster: LocalCluster, namespace: str, pod: str) -> dict[str, Any] | None:
    claim = claim_of(cluster, namespace, pod)
    return claim if claim is not None and claim.get("status", {}).get("allocation") else None


def _claim_msg(claim: dict[str, Any]) -> dra_v1_pb2.Claim:
    meta = claim["metadata"]
    return dra_v1_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


@pytest.fixture(scope="module")
def dirs() -> Iterator[PluginDirs]:
    for root in short_tmp_dir():
        yield PluginDirs(root)


@pytest.fixture(scope="module")
def backend() -> SimulatedBackend:
    return make_backend(node=NODE)


@pytest.fixture(scope="module")
async def scheduled(cluster: LocalCluster, backend: SimulatedBackend) -> AsyncIterator[dict[str, dict[str, Any]]]:
    """The node, its published slices, and four Pods whose claims the scheduler allocated.
    All of it goes again afterwards, so later tests' Pods cannot land on this node's GPUs."""
    node = cluster.add_node(NODE)
    inventory = backend.inventory()
    statuses = [gpu_status(g, _desired(g), None, inventory.driver_version) for g in inventory.gpus]
    slices = build_node_slices(NodeRef(NODE, node["metadata"]["uid"]), statuses)
    apply(cluster, *device_classes(), *slices)
    namespace = "plugin-e2e"
    cluster.kubectl("create", "namespace", namespace)
    await wait_for(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False)
                   .returncode == 0, timeout=30, message="the default ServiceAccount")
    apply(
        cluster,
        claim_template("static-3g", namespace, "mig.tessera.dev",
                  f'{ATTR}.strategy == "MIG" && {ATTR}.migProfile == "3g.40gb"'),
        claim_template("dynamic-2g", namespace, "mig.tessera.dev",
                  f'{ATTR}.strategy == "DynamicMIG" && {ATTR}.migProfile == "2g.20gb"'),
        claim_template("mps-share", namespace, "shared-gpu.tessera.dev", f'{ATTR}.sharing == "MPS"',
                       {"memory": "8Gi", "compute": "25"}),
        claim_template("whole", namespace, "whole-gpu.tessera.dev", f"{ATTR}.index == 3"),
        *(pod_with_claim(n, namespace, n, on_node(NODE)) for n in ("static-3g", "dynamic-2g", "mps-share", "whole")),
    )
    claims = {}
    for pod in ("static-3g", "dynamic-2g", "mps-share", "whole"):
        claims[pod] = await wait_for(lambda p=pod: _allocated_claim(cluster, namespace, p), timeout=90,
                                     message=f"{pod}'s claim to be allocated")
    # A claim nobody allocated (no Pod uses it).
    apply(cluster, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "unallocated", "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "whole-gpu.tessera.dev"}}]}},
    })
    claims["unallocated"] = get(cluster, "resourceclaim", "unallocated", "-n", namespace)
    yield claims
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    cluster.kubectl("delete", "resourceslice", *(s["metadata"]["name"] for s in slices), "--ignore-not-found")
    cluster.kubectl("delete", "node", NODE)


@pytest.fixture
async def api(cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    # From the kubeconfig, the way the agent builds its client.
    async with KubeClient.from_environment(str(cluster.kubeconfig)) as client:
        yield client


def _config(dirs: PluginDirs) -> PluginConfig:
    return PluginConfig(node_name=NODE, registry_dir=dirs.registry, plugin_dir=dirs.plugin, cdi_dir=dirs.cdi,
                        proc_root=dirs.proc)


def _writer(dirs: PluginDirs, api: KubeClient) -> KubeClaimStatusWriter:
    return KubeClaimStatusWriter(api, status_field_manager(_config(dirs)))


def _device_status(cluster: LocalCluster, claim: dict[str, Any]) -> list[dict[str, Any]]:
    meta = claim["metadata"]
    now = get(cluster, "resourceclaim", meta["name"], "-n", meta["namespace"])
    return list(now.get("status", {}).get("devices") or [])


async def _register_like_the_kubelet(dirs: PluginDirs) -> str:
    """What the kubelet's plugin watcher does with a new socket in plugins_registry."""
    (socket,) = list(dirs.registry.glob("*-reg.sock"))
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest())
        assert (info.type, info.name) == ("DRAPlugin", DRIVER)
        assert "v1.DRAPlugin" in info.supported_versions
        await stub.NotifyRegistrationStatus(pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True))
    return str(info.endpoint)


async def test_kubelet_prepares_and_unprepares_scheduled_claims_across_a_restart(
    scheduled: dict[str, dict[str, Any]], backend: SimulatedBackend, dirs: PluginDirs, api: KubeClient,
    cluster: LocalCluster,
) -> None:
    good = [scheduled[p] for p in ("static-3g", "dynamic-2g", "mps-share", "whole")]
    uid = {name: claim["metadata"]["uid"] for name, claim in scheduled.items()}
    results = {name: claim["status"].get("allocation", {}).get("devices", {}).get("results", [{}])[0]
               for name, claim in scheduled.items()}
    dynamic = parse_device_name(results["dynamic-2g"]["device"])
    assert dynamic.kind is DeviceKind.DYNAMIC_MIG
    replaced = dra_v1_pb2.Claim(namespace=good[0]["metadata"]["namespace"], name=good[0]["metadata"]["name"],
                                uid="00000000-1111-2222-3333-444444444444")
    missing = dra_v1_pb2.Claim(namespace=good[0]["metadata"]["namespace"], name="no-such-claim", uid="gone")

    plugin = KubeletPlugin(_config(dirs), backend, KubeClaimReader(api), status_writer=_writer(dirs, api))
    async with plugin:
        endpoint = await _register_like_the_kubelet(dirs)
        assert plugin.registration.registered
        async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            request = dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[*(_claim_msg(c) for c in good), _claim_msg(scheduled["unallocated"]), replaced, missing]
            )
            # Two kubelet calls at once, overlapping claims: both get the same answers.
            first, second = await asyncio.gather(stub.NodePrepareResources(request),
                                                 stub.NodePrepareResources(request))

    assert first == second
    answers = first.claims
    for name in ("static-3g", "dynamic-2g", "mps-share", "whole"):
        answer = answers[uid[name]]
        assert answer.error == "", f"{name}: {answer.error}"
        (device,) = answer.devices
        assert device.device_name == results[name]["device"]
        assert device.pool_name == NODE
        assert list(device.request_names) == ["gpu"]
        assert list(device.cdi_device_ids) == [f"k8s.gpu.tessera.dev/claim={uid[name]}-{device.device_name}"]
    assert answers[uid["mps-share"]].devices[0].share_id == results["mps-share"]["shareID"]
    assert "is not allocated" in answers[uid["unallocated"]].error
    assert "deleted and created again" in answers["00000000-1111-2222-3333-444444444444"].error
    assert "does not exist" in answers["gone"].error

    # The CDI specs say what each container gets.
    def env(name: str) -> dict[str, str]:
        spec = json.loads((dirs.cdi / spec_file_name(uid[name])).read_text())
        return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])

    gpus = backend.inventory().gpus
    made = list(gpus[2].instances)
    assert [(i.profile, i.start) for i in made] == [dynamic.placement], "made at the allocated placement"
    assert env("dynamic-2g")["CUDA_VISIBLE_DEVICES"] == made[0].uuid
    static = next(i for i in gpus[0].instances if (i.profile, i.start) == ("3g.40gb", 0))
    assert env("static-3g")["NVIDIA_VISIBLE_DEVICES"] == static.uuid
    assert env("whole")["CUDA_VISIBLE_DEVICES"] == gpus[3].uuid
    mps = env("mps-share")
    assert mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert mps["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpus[1].uuid}=8192M"
    assert mps["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    in_use = {static.uuid, made[0].uuid, gpus[1].uuid, gpus[3].uuid}
    assert plugin.in_use_device_uuids() == in_use

    # Each prepared claim says, in its status, what its containers got.
    status = {name: _device_status(cluster, c) for name, c in zip(
        ("static-3g", "dynamic-2g", "mps-share", "whole"), good, strict=True)}
    for name, (entry,) in status.items():
        assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, NODE, results[name]["device"]), name
        assert [(c["type"], c["status"]) for c in entry["conditions"]] == [("Ready", "True")], name
        assert entry["data"]["driverVersion"] == backend.inventory().driver_version
    assert status["static-3g"][0]["data"]["uuid"] == static.uuid
    assert status["static-3g"][0]["data"]["migProfile"] == "3g.40gb"
    assert status["dynamic-2g"][0]["data"]["uuid"] == made[0].uuid
    assert status["whole"][0]["data"] == {"uuid": gpus[3].uuid, "gpuUUID": gpus[3].uuid,
                                          "driverVersion": backend.inventory().driver_version}
    assert status["mps-share"][0]["shareID"] == results["mps-share"]["shareID"]
    assert status["mps-share"][0]["data"]["mps"] == {"activeThreadPercentage": 25, "pinnedDeviceMemoryMiB": 8192}
    assert _device_status(cluster, scheduled["unallocated"]) == [], "no status for a claim that was not prepared"

    # The agent restarts: the new plugin knows what was prepared and answers the same.
    restarted = KubeletPlugin(_config(dirs), backend, KubeClaimReader(api), status_writer=_writer(dirs, api))
    async with restarted:
        assert restarted.in_use_device_uuids() == in_use
        endpoint = await _register_like_the_kubelet(dirs)
        async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            again = await stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[_claim_msg(c) for c in good])
            )
            assert dict(again.claims) == {u: answers[u] for u in again.claims}
            assert len(backend.inventory().gpus[2].instances) == 1

            unprepared = await stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[*(_claim_msg(c) for c in good), missing])
            )
            assert {u: r.error for u, r in unprepared.claims.items()} == dict.fromkeys([*(uid[n] for n in (
                "static-3g", "dynamic-2g", "mps-share", "whole")), "gone"], "")

    assert all(_device_status(cluster, c) == [] for c in good), "unprepare takes the status away"
    assert backend.inventory().gpus[2].instances == (), "the dynamic instance is destroyed"
    assert not any(g.in_use for g in backend.inventory().gpus), "every hold is released"
    assert list(dirs.cdi.glob("*.json")) == []
    checkpoint = load_checkpoint(dirs.checkpoint)
    assert checkpoint is not None
    assert checkpoint.claims == {}
    assert not restarted.config.dra_socket.exists()
    assert not restarted.config.registration_socket.exists()


async def test_prepares_start_from_the_agents_claim_watch_and_a_stale_copy_is_redone_from_the_api(
    scheduled: dict[str, dict[str, Any]], backend: SimulatedBackend, dirs: PluginDirs, api: KubeClient,
) -> None:
    """With the agent's claim watch, the plugin starts from the watch's copy and confirms it with
    a read; a copy from before the claim was re-allocated under the same UID (here: the watch
    still says the MPS claim has the whole GPU) is never answered: the API's allocation is."""
    names = ("static-3g", "dynamic-2g", "mps-share", "whole")
    good = [scheduled[p] for p in names]
    watch = ClaimView(api, driver=DRIVER, node=NODE, fence_namespace=INSTALL_NAMESPACE)
    await watch.use(asking=False)  # a spec that does not say claimCheck: Operator
    try:
        await wait_for(lambda: all(watch.claim_copy(c["metadata"]["namespace"], c["metadata"]["name"])
                                   for c in good), timeout=30, message="the watch to have every claim")
        plugin = KubeletPlugin(_config(dirs), backend, KubeClaimReader(api), claim_view=watch)
        async with plugin:
            answers = await plugin.prepare_claims([_ref(c) for c in good])
            assert all(not a.error for a in answers.values()), answers
            registry = plugin.preparer.metrics.registry
            assert registry.get_sample_value("tessera_agent_plugin_claim_reads_total", {"source": "view"}) == 4
            await plugin.unprepare_claims([_ref(c) for c in good])
    finally:
        await watch.stop()

    share, whole = scheduled["mps-share"], scheduled["whole"]
    behind = ClaimView(api, driver=DRIVER, node=NODE, fence_namespace=INSTALL_NAMESPACE, own_watch=False)
    stale = json.loads(json.dumps(share))
    stale["status"]["allocation"] = whole["status"]["allocation"]  # what it had before, say
    stale["metadata"]["resourceVersion"] = "1"
    behind.feed("MODIFIED", stale)
    plugin = KubeletPlugin(_config(dirs), backend, KubeClaimReader(api), claim_view=behind)
    async with plugin:
        answer = (await plugin.prepare_claims([_ref(share)]))[share["metadata"]["uid"]]
        assert answer.error == ""
        assert answer.claim is not None
        assert [d.device for d in answer.claim.devices] == [
            share["status"]["allocation"]["devices"]["results"][0]["device"]]
        gpus = backend.inventory().gpus
        assert plugin.in_use_device_uuids() == {gpus[1].uuid}, "the whole GPU of the stale copy is not held"
        registry = plugin.preparer.metrics.registry
        assert registry.get_sample_value("tessera_agent_plugin_claim_reads_total", {"source": "view_stale"}) == 1
        await plugin.unprepare_claims([_ref(share)])
    assert not any(g.in_use for g in backend.inventory().gpus)


def _ref(claim: dict[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])
