"""Upgrading the NodeLayout CRD from map lists (keyed by uuid, interface and type) to the atomic
lists it has now, on the real apiserver: what was stored under the old schema reads back the
same, and the next writes store one managedFields entry per list instead of one per field of
every item (tessera.models.layout says why)."""

from __future__ import annotations

import copy
import json
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for

pytestmark = pytest.mark.integration

CRD = Path(__file__).resolve().parents[2] / "crds" / "tessera.dev_nodelayouts.yaml"
RESOURCE = "nodelayouts.tessera.dev"
# The lists as they were before they became atomic: path -> map key.
MAP_LISTS = {("spec", "gpus"): "uuid", ("status", "gpus"): "uuid", ("status", "nics"): "interface",
             ("status", "conditions"): "type"}


def _crd_with_map_lists() -> dict[str, Any]:
    crd: dict[str, Any] = copy.deepcopy(yaml.safe_load(CRD.read_text()))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    for (side, field), key in MAP_LISTS.items():
        schema[side]["properties"][field].update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]})
    return crd


def _gpu(uuid: str, index: int) -> dict[str, Any]:
    return {"uuid": uuid, "index": index, "productName": "NVIDIA H100 80GB HBM3", "memoryMib": 81559,
            "strategy": "MIG", "migInstances": [{"profile": "3g.40gb", "start": 0, "size": 4, "uuid": f"MIG-{uuid}",
                                                  "gpuInstanceId": 1, "memoryMib": 40448}]}


def _status(message: str) -> dict[str, Any]:
    return {"backend": "simulated", "gpus": [_gpu("GPU-a", 0), _gpu("GPU-b", 1)],
            "nics": [{"interface": "eth1", "speedMbps": 40000}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "Applied", "message": message,
                            "lastTransitionTime": "2026-12-07T00:00:00Z"}]}


def _stored(cluster: LocalCluster, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(cluster.kubectl("get", RESOURCE, name, "-o", "json",
                                                     "--show-managed-fields").stdout)
    return obj


def _item_keys(obj: dict[str, Any]) -> set[str]:
    """The per-item keys (``k:{...}``) of every managedFields entry: what a map list tracks."""
    keys: set[str] = set()

    def walk(fields: dict[str, Any]) -> None:
        for name, sub in fields.items():
            if name.startswith("k:"):
                keys.add(name)
            walk(sub)

    for entry in obj["metadata"]["managedFields"]:
        walk(entry["fieldsV1"])
    return keys


@pytest.fixture
def old_crd(cluster: LocalCluster) -> Iterator[None]:
    cluster.apply_objects([_crd_with_map_lists()])
    try:
        yield
    finally:
        cluster.apply(CRD)  # later modules get the CRD as it is now, whatever happened here


async def test_objects_stored_with_map_lists_survive_the_upgrade_to_atomic_lists(
    cluster: LocalCluster, old_crd: None
) -> None:
    name = f"upgrade-{uuidlib.uuid4().hex[:8]}"
    mig = {"uuid": "GPU-a", "strategy": "MIG", "migInstances": [{"profile": "3g.40gb", "start": 0}]}
    body = {"apiVersion": "tessera.dev/v1alpha1", "kind": "NodeLayout", "metadata": {"name": name},
            "spec": {"gpus": [mig, {"uuid": "GPU-b"}]}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(body))
    try:
        cluster.kubectl("patch", RESOURCE, name, "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": _status("before")}))
        before = _stored(cluster, name)
        assert {'k:{"uuid":"GPU-a"}', 'k:{"interface":"eth1"}', 'k:{"type":"Ready"}'} <= _item_keys(before)

        cluster.apply(CRD)
        upgraded = _stored(cluster, name)
        assert (upgraded["spec"], upgraded["status"]) == (before["spec"], before["status"])  # nothing lost

        def written_atomic() -> dict[str, Any] | None:
            # The apiserver takes up a changed CRD in a moment: write until a write sees it.
            cluster.kubectl("patch", RESOURCE, name, "--subresource=status", "--type=merge",
                            "-p", json.dumps({"status": _status(f"after {uuidlib.uuid4().hex}")}))
            cluster.kubectl("patch", RESOURCE, name, "--type=merge",
                            "-p", json.dumps({"spec": {"gpus": [{"uuid": "GPU-a"}]}}))
            obj = _stored(cluster, name)
            return obj if not _item_keys(obj) else None

        after = await wait_for(written_atomic, timeout=30, message="writes under the atomic lists")
        assert after["spec"]["gpus"] == [{"uuid": "GPU-a", "strategy": "Exclusive"}]
        assert [g["uuid"] for g in after["status"]["gpus"]] == ["GPU-a", "GPU-b"]
        assert after["status"]["conditions"][0]["message"].startswith("after ")
        size = {"before": len(json.dumps(before["metadata"]["managedFields"])),
                "after": len(json.dumps(after["metadata"]["managedFields"]))}
        assert size["after"] * 2 < size["before"], size
    finally:
        cluster.kubectl("delete", RESOURCE, name, "--ignore-not-found", check=False)
