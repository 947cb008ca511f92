"""What a Pod's NIC share interfaces are called: ``net1``, ``net2``, … in the order the kubelet
asks for them, or the name the claim gives a share.

Names are chosen at prepare, where they go into the checkpoint and the claim's
``status.devices[].networkData.interfaceName``, and the attach hook only applies them. The
kubelet prepares a Pod's claims of one driver in one NodePrepareResources call, in the Pod's
order, so numbering the shares across that call's claims (each claim's results in the order the
scheduler wrote them) gives every share of a Pod its own name: ``net1`` for the first, ``net2``
for the next. A claim prepared before (shared with a Pod that runs already) keeps its names.

A claim may name a share itself, with opaque configuration for ``nic.tessera.dev``::

    config:
    - requests: [storage]            # absent: every request of the claim
      opaque:
        driver: nic.tessera.dev
        parameters: {apiVersion: nic.tessera.dev/v1alpha1, kind: NicShareConfig, interfaceName: storage0}

The name must be a Linux interface name, not one every Pod has (``lo``, ``eth0``), not of the
``net<N>`` form Tessera numbers shares with, and not given to two shares of the claim; anything
else is refused with the reason, before anything is made. Configuration from the claim's class
comes first in the allocation and the claim's own wins.
Pure: claims (JSON) and names in, names out. Not for: renaming anything (``shaping``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tessera.models.network import INTERFACE_NAME_PATTERN

NIC_SHARE_CONFIG_API = "nic.tessera.dev/v1alpha1"
NIC_SHARE_CONFIG_KIND = "NicShareConfig"
AUTO_PREFIX = "net"
FIRST_AUTO = 1
RESERVED = frozenset({"lo", "eth0"})  # every Pod has them (eth0: the Pod network's interface)
_AUTO = re.compile(AUTO_PREFIX + r"(\d+)")
_INTERFACE = re.compile(INTERFACE_NAME_PATTERN)


class NamingError(ValueError):
    """A claim's NicShareConfig cannot be used; the message says why and how to fix it."""


def auto_name(number: int) -> str:
    return f"{AUTO_PREFIX}{number}"


def next_auto(names: Iterable[str]) -> int:
    """The number after the highest ``net<N>`` among ``names`` (FIRST_AUTO when there is none)."""
    numbers = [int(m.group(1)) for name in names if (m := _AUTO.fullmatch(name))]
    return max(numbers, default=FIRST_AUTO - 1) + 1


def parse_share_config(parameters: Any) -> str:
    """The interface name a NicShareConfig gives; NamingError when it is not one."""
    if not isinstance(parameters, Mapping):
        raise NamingError(f"the {NIC_SHARE_CONFIG_KIND} must be an object, not {type(parameters).__name__}")
    if parameters.get("apiVersion") != NIC_SHARE_CONFIG_API or parameters.get("kind") != NIC_SHARE_CONFIG_KIND:
        raise NamingError(
            f"opaque parameters for nic.tessera.dev must be apiVersion {NIC_SHARE_CONFIG_API}, kind "
            f"{NIC_SHARE_CONFIG_KIND}; got {parameters.get('apiVersion')!r}, {parameters.get('kind')!r}"
        )
    unknown = sorted(set(parameters) - {"apiVersion", "kind", "interfaceName"})
    if unknown:
        raise NamingError(f"{NIC_SHARE_CONFIG_KIND} has no field {', '.join(unknown)} (it has interfaceName)")
    name = parameters.get("interfaceName")
    if not isinstance(name, str) or not _INTERFACE.fullmatch(name) or name in (".", ".."):
        raise NamingError(
            f"{NIC_SHARE_CONFIG_KIND}.interfaceName {name!r} is not a Linux interface name "
            "(1 to 15 letters, digits, '_', '-', '.', ':' or '@', not starting with a punctuation mark)"
        )
    if name in RESERVED:
        raise NamingError(f"{NIC_SHARE_CONFIG_KIND}.interfaceName {name!r} is taken in every Pod: choose another")
    if _AUTO.fullmatch(name):
        raise NamingError(
            f"{NIC_SHARE_CONFIG_KIND}.interfaceName {name!r}: names net<N> are the ones Tessera numbers unnamed "
            "shares with; choose another, or leave interfaceName out to get one of them"
        )
    return name


def configured_names(claim: Mapping[str, Any], driver: str) -> dict[str | None, str]:
    """Request name -> the interface name the allocation's opaque configuration for ``driver``
    gives it (key None: a configuration for every request). Later entries win."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    out: dict[str | None, str] = {}
    for entry in (allocation.get("devices") or {}).get("config") or []:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        name = parse_share_config(opaque.get("parameters"))
        requests = entry.get("requests") or [None]
        for request in requests:
            if request is None:
                out = {key: value for key, value in out.items() if key is None}
            out[request] = name
    return out


def share_names(requests: Sequence[str], configured: Mapping[str | None, str], first_auto: int) -> list[str]:
    """The interface name of each share, by its request (``req`` or ``req/sub``): the configured
    one, else the next ``net<N>`` from ``first_auto``; NamingError when two shares get one name."""
    names: list[str] = []
    number = first_auto
    for request in requests:
        parent = request.split("/", 1)[0]
        name = configured.get(request) or configured.get(parent) or configured.get(None)
        if name is None:
            name = auto_name(number)
            number += 1
        if name in names:
            first = requests[names.index(name)]
            raise NamingError(
                f"interface name {name!r} is given to two shares of the claim (requests {first!r} and {request!r}): "
                f"give each its own {NIC_SHARE_CONFIG_KIND}, naming its request in config.requests"
            )
        names.append(name)
    return names
