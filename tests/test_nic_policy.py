"""NetworkSharingPolicy: what the model accepts, what it refuses and with which message, and
that its CRD carries the same rules for the apiserver."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tessera.models.crd import crds, network_sharing_policy_crd
from tessera.models.network import NetworkSharingPolicy


def _policy(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "NetworkSharingPolicy",
        "metadata": {"name": "uplinks"},
        "spec": {"interfaces": ["eth0"], **spec},
    }


def test_a_minimal_policy_sells_one_gigabit_shares_at_the_reported_speed() -> None:
    policy = NetworkSharingPolicy.from_kube(_policy())
    assert policy.spec.line_rate_bps is None
    assert (policy.spec.share.default_bps, policy.spec.share.min_bps, policy.spec.share.step_bps) == (10**9,) * 3
    assert policy.spec.share.ceiling_bps is None
    assert policy.spec.addresses is None


def test_a_full_policy_reads_back_in_bits_per_second() -> None:
    policy = NetworkSharingPolicy.from_kube(
        _policy(
            lineRate="40G",
            share={"default": "2G", "min": "1G", "step": "500M", "ceiling": "10G"},
            addresses={"cidr": "10.20.0.0/24"},
            nodeSelector={"matchLabels": {"pool": "training"}},
        )
    )
    assert policy.spec.line_rate_bps == 40 * 10**9
    assert policy.spec.share.default_bps == 2 * 10**9
    assert policy.spec.share.step_bps == 500 * 10**6
    assert policy.spec.share.ceiling_bps == 10 * 10**9
    assert policy.to_kube()["spec"]["share"]["ceiling"] == "10G"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"share": {"step": "0"}}, "share.step must be greater than zero"),
        ({"share": {"min": "0", "default": "0"}}, "share.min must be greater than zero"),
        ({"share": {"default": "1G", "min": "2G"}}, "share.default must be at least share.min"),
        ({"share": {"default": "2500M", "min": "1G", "step": "1G"}}, "whole number of steps"),
        ({"share": {"ceiling": "500M"}}, "share.ceiling must be at least share.min"),
        ({"lineRate": "500M"}, "lineRate must be at least share.min"),
        ({"addresses": {"cidr": "10.20.0.300/24"}}, "addresses.cidr must be a network"),
        ({"interfaces": ["eth0", "eth0"]}, "interfaces: each name once"),
        ({"interfaces": ["a/b"]}, "is not an interface name"),
        ({"interfaces": ["a-name-longer-than-15"]}, "is not an interface name"),
        ({"interfaces": []}, "interfaces"),
        ({"lineRate": "fast"}, "lineRate"),
    ],
)
def test_bad_input_is_refused_with_a_message_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        NetworkSharingPolicy.from_kube(_policy(**spec))
    assert message in str(refused.value)


def test_the_crd_is_shipped_with_a_short_name_and_the_same_rules_as_cel() -> None:
    crd = network_sharing_policy_crd()
    assert "tessera.dev_networksharingpolicies.yaml" in crds()
    assert crd["spec"]["names"]["kind"] == "NetworkSharingPolicy"
    assert crd["spec"]["names"]["shortNames"] == ["nsp"]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["interfaces"]
    messages = {v["message"] for v in spec["properties"]["share"]["x-kubernetes-validations"]}
    assert messages == {
        "share.step must be greater than zero",
        "share.min must be greater than zero",
        "share.default must be at least share.min",
        "share.default must be share.min plus a whole number of steps",
        "share.ceiling must be at least share.min (leave it out to forbid borrowing)",
    }
    assert spec["x-kubernetes-validations"][0]["message"] == "lineRate must be at least share.min"
    assert spec["properties"]["addresses"]["properties"]["cidr"]["x-kubernetes-validations"][0]["rule"] == (
        "isCIDR(self)"
    )
