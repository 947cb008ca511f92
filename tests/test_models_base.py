"""KubeModel, the base of every model: what every parsed object shares."""

from __future__ import annotations

import json

from tessera.models.layout import GpuLayout, GpuStatus
from tests.dra_gpus import mig_gpu


def test_parsed_models_share_their_set_of_given_fields_and_a_copy_gets_its_own() -> None:
    """One set of field names per shape, not per object (most of a parsed NodeLayout's memory);
    frozen models never change it in place, and ``model_copy`` with updates copies it first."""
    first = GpuStatus.from_kube(mig_gpu(0).to_kube())
    second = GpuStatus.from_kube(mig_gpu(1).to_kube())
    assert first.model_fields_set is second.model_fields_set

    given = {"uuid", "index", "product_name", "memory_mib"}
    minimal = GpuStatus.model_validate({"uuid": "GPU-x", "index": 0, "productName": "GPU", "memoryMib": 1})
    assert minimal.model_fields_set == given, "a different shape has a set of its own"
    changed = minimal.model_copy(update={"message": "hello"})
    assert changed.model_fields_set == given | {"message"}
    assert minimal.model_fields_set == given
    again = GpuStatus.model_validate({"uuid": "GPU-y", "index": 1, "productName": "GPU", "memoryMib": 1})
    assert again.model_fields_set is minimal.model_fields_set == given


def test_values_that_repeat_across_a_fleet_are_held_once_and_read_back_unchanged() -> None:
    """Parsed from the wire (fresh strings each time, as every watch event brings), two GPUs'
    product names and profiles are one string each, and two GPU layouts listing the same MIG
    placement share it; what they say and serialise to is unchanged."""
    wire = [json.loads(json.dumps(mig_gpu(i).to_kube())) for i in (0, 1)]
    first, second = (GpuStatus.from_kube(w) for w in wire)
    assert first.product_name is second.product_name
    assert first.mig_instances[0].profile is second.mig_instances[0].profile
    assert first.uuid != second.uuid
    assert [g.to_kube() for g in (first, second)] == wire

    placed = [{"profile": "1g.10gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]
    layouts = [GpuLayout.from_kube(json.loads(json.dumps({"uuid": f"GPU-{i}", "strategy": "MIG",
                                                         "migInstances": placed}))) for i in (0, 1)]
    assert all(a is b for a, b in zip(layouts[0].mig_instances, layouts[1].mig_instances, strict=True))
    assert [p.to_kube() for p in layouts[1].mig_instances] == placed
