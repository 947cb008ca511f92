"""A Pod's NIC share interfaces are named net1, net2, … across the claims the kubelet prepares
together, or as the claim's NicShareConfig says; a config that cannot be used is refused with
the reason (tessera.agent.nics.naming)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.agent.nics.naming import NamingError, configured_names, next_auto, parse_share_config, share_names

DRIVER = "nic.tessera.dev"


def config(name: Any, requests: list[str] | None = None, driver: str = DRIVER, **extra: Any) -> dict[str, Any]:
    parameters = {"apiVersion": "nic.tessera.dev/v1alpha1", "kind": "NicShareConfig", "interfaceName": name, **extra}
    entry: dict[str, Any] = {"source": "FromClaim", "opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def claim(*configs: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [], "config": list(configs)}}}}


def test_unnamed_shares_are_numbered_from_where_the_pods_previous_claims_stopped() -> None:
    assert share_names(["a", "b"], {}, 1) == ["net1", "net2"]
    assert share_names(["c"], {}, next_auto(["net1", "net2"])) == ["net3"]
    assert next_auto([]) == 1
    assert next_auto(["storage0", "net4", "net10"]) == 11, "by number, not by text"


def test_a_named_share_keeps_its_name_and_the_others_are_numbered_without_a_gap() -> None:
    names = configured_names(claim(config("storage0", ["b"])), DRIVER)
    assert names == {"b": "storage0"}
    assert share_names(["a", "b", "c"], names, 1) == ["net1", "storage0", "net2"]


def test_a_subrequest_takes_its_parent_requests_name_and_a_config_for_all_applies_to_each() -> None:
    assert share_names(["fast/x"], {"fast": "fast0"}, 1) == ["fast0"]
    assert share_names(["fast/x"], {"fast/x": "x0", "fast": "fast0"}, 1) == ["x0"]
    assert share_names(["only"], configured_names(claim(config("data0")), DRIVER), 1) == ["data0"]


def test_the_claims_own_config_wins_over_its_classs_and_other_drivers_configs_are_not_read() -> None:
    from_class = {**config("class0"), "source": "FromClass"}
    assert configured_names(claim(from_class, config("claim0")), DRIVER) == {None: "claim0"}
    assert configured_names(claim(config("mine0", ["a"]), config("all0")), DRIVER) == {None: "all0"}
    other = config("whatever!", driver="gpu.tessera.dev")
    assert configured_names(claim(other), DRIVER) == {}, "another driver's parameters are its own business"


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ("storage0", "must be an object"),
        ({"apiVersion": "v1", "kind": "NicShareConfig", "interfaceName": "a"}, "must be apiVersion"),
        ({"apiVersion": "nic.tessera.dev/v1alpha1", "kind": "GpuConfig", "interfaceName": "a"}, "kind NicShareConfig"),
        (config("a", mtu=9000)["opaque"]["parameters"], "has no field mtu"),
        (config("much-too-long-name")["opaque"]["parameters"], "is not a Linux interface name"),
        (config("a/b")["opaque"]["parameters"], "is not a Linux interface name"),
        (config(7)["opaque"]["parameters"], "is not a Linux interface name"),
        (config("eth0")["opaque"]["parameters"], "taken in every Pod"),
        (config("net2")["opaque"]["parameters"], "names net<N> are the ones Tessera numbers"),
    ],
)
def test_a_share_config_that_cannot_be_used_is_refused_with_the_reason(parameters: Any, message: str) -> None:
    with pytest.raises(NamingError, match=message):
        parse_share_config(parameters)


def test_one_name_for_two_shares_of_a_claim_is_refused_naming_both_requests() -> None:
    names = configured_names(claim(config("data0")), DRIVER)
    with pytest.raises(NamingError, match="'data0' is given to two shares of the claim \\(requests 'a' and 'b'\\)"):
        share_names(["a", "b"], names, 1)
