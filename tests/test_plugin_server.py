"""The plugin's gRPC servers on real unix sockets, called the way the kubelet calls them, with
the stubs generated from our .proto files (independent of the server's own wiring)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.plugin import KubeletPlugin, PluginConfig, serve_plugin
from tessera.agent.plugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from tessera.kube.http import Credentials, KubeClient
from tests.plugin_helpers import (
    MPS,
    NODE,
    WHOLE,
    FakeClaimReader,
    PluginDirs,
    claim,
    dynamic,
    gpu,
    make_backend,
    result,
    short_tmp_dir,
)


@pytest.fixture
def dirs() -> Iterator[PluginDirs]:
    for root in short_tmp_dir():
        yield PluginDirs(root)


@pytest.fixture
def backend() -> SimulatedBackend:
    return make_backend()


@pytest.fixture
def reader() -> FakeClaimReader:
    return FakeClaimReader()


def config(dirs: PluginDirs) -> PluginConfig:
    return PluginConfig(
        node_name=NODE, registry_dir=dirs.registry, plugin_dir=dirs.plugin, cdi_dir=dirs.cdi, proc_root=dirs.proc
    )


@pytest.fixture
async def plugin(backend: SimulatedBackend, reader: FakeClaimReader, dirs: PluginDirs) -> AsyncIterator[KubeletPlugin]:
    async with KubeletPlugin(config(dirs), backend, reader) as running:
        yield running


def claim_msg(pb: object, body: dict[str, object]) -> object:
    meta = body["metadata"]
    assert isinstance(meta, dict)
    return pb.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])  # type: ignore[attr-defined]


async def test_sockets_are_at_the_kubelets_paths_and_go_away_on_stop(
    backend: SimulatedBackend, reader: FakeClaimReader, dirs: PluginDirs
) -> None:
    cfg = config(dirs)
    assert cfg.registration_socket == dirs.registry / "gpu.tessera.dev-reg.sock"
    assert cfg.dra_socket == dirs.plugin / "dra.sock"
    assert PluginConfig(node_name="n").dra_socket == Path("/var/lib/kubelet/plugins/gpu.tessera.dev/dra.sock")
    assert PluginConfig(node_name="n").registration_socket == Path(
        "/var/lib/kubelet/plugins_registry/gpu.tessera.dev-reg.sock"
    )
    dirs.registry.mkdir(parents=True)
    cfg.registration_socket.write_text("stale socket of a crashed agent")

    async with KubeletPlugin(cfg, backend, reader):
        assert cfg.registration_socket.is_socket()
        assert cfg.dra_socket.is_socket()
    assert not cfg.registration_socket.exists()
    assert not cfg.dra_socket.exists()


async def test_registration_answers_like_a_dra_plugin_and_hears_the_kubelets_verdict(
    plugin: KubeletPlugin, dirs: PluginDirs
) -> None:
    async with grpc.aio.insecure_channel(f"unix://{plugin.config.registration_socket}") as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest())
        assert info.type == "DRAPlugin"
        assert info.name == "gpu.tessera.dev"
        assert info.endpoint == str(dirs.plugin / "dra.sock")
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]

        await stub.NotifyRegistrationStatus(pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True))
        assert plugin.registration.registered is True

        with pytest.raises(grpc.aio.AioRpcError, match="failed registration process: version mismatch"):
            await stub.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=False, error="version mismatch")
            )
        assert plugin.registration.registered is False
        assert plugin.registration.error == "version mismatch"
        # The plugin keeps serving after a refusal: the kubelet may try again.
        assert (await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest())).name == "gpu.tessera.dev"


async def test_v1_prepare_answers_every_claim_good_or_bad_and_unprepare_cleans_up(
    plugin: KubeletPlugin, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    share = claim("share", result(MPS, "mps", share_id="sh-1", consumed={"memory": "4Gi", "compute": "10"}))
    dyn = claim("dyn", result(dynamic("3g.40gb", 0), "part"))
    elsewhere = claim("elsewhere", result(WHOLE, pool="gpu-node-2"))
    reader.add(share, dyn, elsewhere)
    uids = {b["metadata"]["name"]: b["metadata"]["uid"] for b in (share, dyn, elsewhere)}

    async with grpc.aio.insecure_channel(f"unix://{plugin.config.dra_socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        response = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim_msg(dra_v1_pb2, b) for b in (share, dyn, elsewhere)])
        )
        assert set(response.claims) == set(uids.values())
        got = response.claims[uids["share"]]
        assert got.error == ""
        (device,) = got.devices
        assert (list(device.request_names), device.pool_name, device.device_name) == (["mps"], NODE, MPS)
        assert list(device.cdi_device_ids) == [f"k8s.gpu.tessera.dev/claim={uids['share']}-{MPS}"]
        assert device.HasField("share_id")
        assert device.share_id == "sh-1"
        (part,) = response.claims[uids["dyn"]].devices
        assert not part.HasField("share_id")
        assert "this is node gpu-node-1" in response.claims[uids["elsewhere"]].error
        assert not response.claims[uids["elsewhere"]].devices
        assert len(gpu(backend, 2).instances) == 1

        unprepared = await stub.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim_msg(dra_v1_pb2, b) for b in (share, dyn, elsewhere)])
        )
        assert {uid: r.error for uid, r in unprepared.claims.items()} == dict.fromkeys(uids.values(), "")
    assert gpu(backend, 2).instances == ()
    assert list(dirs.cdi.glob("*.json")) == []
    assert plugin.in_use_device_uuids() == frozenset()


async def test_v1beta1_serves_the_same_prepare(
    plugin: KubeletPlugin, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    body = claim("beta", result(WHOLE))
    reader.add(body)
    uid = body["metadata"]["uid"]
    async with grpc.aio.insecure_channel(f"unix://{plugin.config.dra_socket}") as channel:
        stub = dra_v1beta1_pb2_grpc.DRAPluginStub(channel)
        response = await stub.NodePrepareResources(
            dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=[claim_msg(dra_v1beta1_pb2, body)])
        )
        (device,) = response.claims[uid].devices
        assert list(device.cdi_device_ids) == [f"k8s.gpu.tessera.dev/claim={uid}-{WHOLE}"]
        spec = json.loads(next(dirs.cdi.glob("*.json")).read_text())
        assert spec["devices"][0]["name"] == f"{uid}-{WHOLE}"
        unprepared = await stub.NodeUnprepareResources(
            dra_v1beta1_pb2.NodeUnprepareResourcesRequest(claims=[claim_msg(dra_v1beta1_pb2, body)])
        )
        assert unprepared.claims[uid].error == ""


async def test_an_unexpected_failure_is_that_claims_answer_and_the_plugin_keeps_serving(
    plugin: KubeletPlugin, reader: FakeClaimReader
) -> None:
    good = claim("good", result(WHOLE))
    reader.add(good)

    class OutageError(Exception):
        pass

    original = reader.read_claim

    async def flaky(namespace: str, name: str) -> dict[str, object] | None:
        if name == "unlucky":
            raise OutageError("apiserver unreachable")
        return await original(namespace, name)

    reader.read_claim = flaky  # type: ignore[method-assign]
    bad = claim("unlucky", result(WHOLE))
    async with grpc.aio.insecure_channel(f"unix://{plugin.config.dra_socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        response = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim_msg(dra_v1_pb2, b) for b in (bad, good)])
        )
        assert "OutageError: apiserver unreachable" in response.claims[bad["metadata"]["uid"]].error
        assert response.claims[good["metadata"]["uid"]].error == ""
        again = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim_msg(dra_v1_pb2, good)])
        )
        assert again.claims[good["metadata"]["uid"]] == response.claims[good["metadata"]["uid"]]


async def test_many_kubelet_calls_at_once_are_all_answered(
    plugin: KubeletPlugin, reader: FakeClaimReader, backend: SimulatedBackend
) -> None:
    reader.delay_s = 0.005
    bodies = [claim(f"c{n}", result(dynamic("1g.10gb", n))) for n in range(7)]
    reader.add(*bodies)
    async with grpc.aio.insecure_channel(f"unix://{plugin.config.dra_socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        responses = await asyncio.gather(*(
            stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim_msg(dra_v1_pb2, b)]))
            for b in bodies
        ))
    errors = [r.claims[b["metadata"]["uid"]].error for r, b in zip(responses, bodies, strict=True)]
    assert errors == [""] * 7
    assert len(gpu(backend, 2).instances) == 7


async def test_serve_plugin_runs_until_told_to_stop(backend: SimulatedBackend, dirs: PluginDirs) -> None:
    cfg = config(dirs)
    stop, started = asyncio.Event(), asyncio.Event()
    running: list[KubeletPlugin] = []

    def on_start(plugin: KubeletPlugin) -> None:
        running.append(plugin)
        started.set()

    async with KubeClient(Credentials(server="http://127.0.0.1:1")) as api:  # never called
        task = asyncio.create_task(serve_plugin(cfg, backend, api, stop=stop, started=on_start))
        await asyncio.wait_for(started.wait(), timeout=10)
        assert cfg.registration_socket.is_socket()
        assert running[0].in_use_device_uuids() == frozenset()
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    assert not cfg.registration_socket.exists()
    assert not cfg.dra_socket.exists()
