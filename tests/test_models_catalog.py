"""One catalog lookup for a GPU: the planner and the publisher read the same model for it."""

from __future__ import annotations

import pytest

from tessera.dra.devices import build_gpu_devices
from tessera.models.catalog import MODELS_BY_KEY, catalog_model
from tessera.models.layout import GpuStatus
from tessera.models.policy import SharingPolicySpec
from tessera.planner import PlanError, PlanErrorReason, plan_gpu_layout
from tests.dra_gpus import dynamic_gpu

H100 = MODELS_BY_KEY["H100-80GB"]
A100 = MODELS_BY_KEY["A100-40GB"]
DYNAMIC_MIG = SharingPolicySpec.model_validate({"strategy": "DynamicMIG"})


def test_a_known_key_names_the_model() -> None:
    assert catalog_model("A100-40GB", H100.product_name) is A100


@pytest.mark.parametrize("key", [None, "", "H100-80GB-from-a-newer-agent"])
def test_without_a_known_key_the_product_name_names_the_model(key: str | None) -> None:
    assert catalog_model(key, H100.product_name) is H100


@pytest.mark.parametrize("key", [None, "", "B300-288GB"])
def test_an_unknown_model_has_no_catalog_entry(key: str | None) -> None:
    assert catalog_model(key, "NVIDIA B300") is None


def test_planner_and_publisher_agree_on_a_gpu_whose_key_is_unknown_but_product_is_known() -> None:
    gpu = dynamic_gpu().model_copy(update={"model": "H100-80GB-from-a-newer-agent"})
    assert plan_gpu_layout(DYNAMIC_MIG, gpu).strategy.value == "DynamicMIG"
    published = build_gpu_devices(gpu)
    assert published.devices, "the publisher knows the model the planner planned for"
    assert not published.problems


def test_planner_and_publisher_agree_on_an_unknown_model() -> None:
    gpu: GpuStatus = dynamic_gpu().model_copy(update={"model": "B300-288GB", "product_name": "NVIDIA B300"})
    with pytest.raises(PlanError) as caught:
        plan_gpu_layout(DYNAMIC_MIG, gpu)
    assert caught.value.reason is PlanErrorReason.NO_MIG
    published = build_gpu_devices(gpu)
    assert published.devices == ()
    assert published.problems == ("GPU 0 (NVIDIA B300) has no known MIG profiles; DynamicMIG publishes nothing",)
