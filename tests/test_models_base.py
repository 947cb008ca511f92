"""KubeModel, the base of every model: what every parsed object shares."""

from __future__ import annotations

from tessera.models.layout import GpuStatus
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
