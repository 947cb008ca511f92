"""The NetworkSharingPolicy API (``tessera.dev/v1alpha1``): which NICs are sold in shares, and how.

A kind of its own rather than a device family inside SharingPolicy. A platform team reads a
policy top to bottom; in SharingPolicy every field (``strategy``, ``mig``, ``timeSlicing``,
``mps``, ``drain``) is about cutting a GPU, and a NIC would have turned each of them into "only
when the family is GPU" and added four more "only when the family is NIC" rules. Two kinds keep
both small: ``kubectl get nsp`` lists the network policies alone, their printer columns and status
counts speak of NICs and shares, and neither schema carries fields the other ignores. Priority
and ``nodeSelector`` mean the same in both.

Rates are bits per second, written as Kubernetes quantities with decimal suffixes as link speeds
are (``40G`` = 40,000,000,000 bit/s). The cross-field rules are written twice, as in
``tessera.models.policy``: pydantic validators (offline checks) and CEL rules (admission), with
the same messages. Not for: matching NICs to policies or building devices (``tessera.dra.nics``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal, Self

from pydantic import ConfigDict, Field, field_validator, model_validator

from tessera.models.base import KubeModel
from tessera.models.conditions import Condition
from tessera.models.policy import LabelSelector, ObjectMeta
from tessera.models.quantity import Quantity, parse_quantity

# Linux interface names: at most 15 bytes, no '/', no whitespace, not '.' or '..'.
INTERFACE_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}$"

_IF_QUANTITIES = "!(isQuantity(self.default) && isQuantity(self.min) && isQuantity(self.step)) || "


class BandwidthShare(KubeModel):
    """How a NIC's rate is sold: a claim's ``capacity.requests.bandwidth`` is rounded up to
    ``min`` plus whole ``step``s, ``default`` when it asks for none. Becomes the device's
    ``requestPolicy``."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": _IF_QUANTITIES + "quantity(self.step).isGreaterThan(quantity('0'))",
                    "message": "share.step must be greater than zero",
                },
                {
                    "rule": _IF_QUANTITIES + "quantity(self.min).isGreaterThan(quantity('0'))",
                    "message": "share.min must be greater than zero",
                },
                {
                    "rule": _IF_QUANTITIES + "quantity(self.min).compareTo(quantity(self.default)) <= 0",
                    "message": "share.default must be at least share.min",
                },
                {
                    "rule": _IF_QUANTITIES + "!quantity(self.step).isGreaterThan(quantity('0')) || "
                    "(quantity(self.default).asInteger() - quantity(self.min).asInteger()) "
                    "% quantity(self.step).asInteger() == 0",
                    "message": "share.default must be share.min plus a whole number of steps",
                },
                {
                    "rule": "!has(self.ceiling) || !isQuantity(self.ceiling) || !isQuantity(self.min) || "
                    "quantity(self.ceiling).compareTo(quantity(self.min)) >= 0",
                    "message": "share.ceiling must be at least share.min (leave it out to forbid borrowing)",
                },
            ]
        }
    )

    default: Quantity = Field(default="1G", description="bits per second a claim gets when it asks for none")
    min: Quantity = Field(default="1G", description="the smallest share, in bits per second")
    step: Quantity = Field(default="1G", description="shares are min plus whole steps")
    ceiling: Quantity | None = Field(
        default=None,
        description="a share may borrow idle bandwidth up to this rate (never less than its own); "
        "absent: a share never exceeds what it booked",
    )

    @model_validator(mode="after")
    def _range_holds(self) -> Self:
        default, low, step = (parse_quantity(v) for v in (self.default, self.min, self.step))
        if step <= 0:
            raise ValueError("share.step must be greater than zero")
        if low <= 0:
            raise ValueError("share.min must be greater than zero")
        if default < low:
            raise ValueError("share.default must be at least share.min")
        if (default - low) % step:
            raise ValueError("share.default must be share.min plus a whole number of steps")
        if self.ceiling is not None and parse_quantity(self.ceiling) < low:
            raise ValueError("share.ceiling must be at least share.min (leave it out to forbid borrowing)")
        return self

    @property
    def default_bps(self) -> int:
        return parse_quantity(self.default)

    @property
    def min_bps(self) -> int:
        return parse_quantity(self.min)

    @property
    def step_bps(self) -> int:
        return parse_quantity(self.step)

    @property
    def ceiling_bps(self) -> int | None:
        return parse_quantity(self.ceiling) if self.ceiling is not None else None


class Addresses(KubeModel):
    """Addresses for the shares' interfaces: one from ``cidr`` per share on a NIC. Absent: the
    interface comes up without an address (L2 use; the workload brings its own)."""

    cidr: str = Field(
        min_length=9,
        max_length=43,
        pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "isCIDR(self)", "message": "addresses.cidr must be a network such as 10.20.0.0/24"}
            ]
        },
    )

    @field_validator("cidr")
    @classmethod
    def _is_network(cls, value: str) -> str:
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ValueError("addresses.cidr must be a network such as 10.20.0.0/24") from None
        return value


class NetworkSharingPolicySpec(KubeModel):
    """Which nodes and interfaces, sold in which shares."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.lineRate) || !isQuantity(self.lineRate) || !isQuantity(self.share.min) || "
                    "quantity(self.lineRate).compareTo(quantity(self.share.min)) >= 0",
                    "message": "lineRate must be at least share.min",
                },
            ]
        }
    )

    priority: int = Field(default=0, ge=0, le=1_000_000, description="higher wins; ties go to the name")
    node_selector: LabelSelector = Field(default_factory=LabelSelector)
    interfaces: list[str] = Field(
        min_length=1,
        max_length=32,
        description="the uplinks to share, by interface name (e.g. eth0, ens1f0np0)",
        json_schema_extra={
            "x-kubernetes-list-type": "set",
            "items": {"type": "string", "maxLength": 15, "pattern": INTERFACE_NAME_PATTERN},
        },
    )
    line_rate: Quantity | None = Field(
        default=None,
        description="bits per second to sell per NIC; absent: the speed the NIC reports (sysfs)",
    )
    share: BandwidthShare = Field(default_factory=BandwidthShare)
    addresses: Addresses | None = None

    @field_validator("interfaces")
    @classmethod
    def _names_are_interfaces(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if not re.fullmatch(INTERFACE_NAME_PATTERN, n)]
        if bad:
            raise ValueError(
                f"interfaces: {', '.join(repr(b) for b in bad)} is not an interface name "
                "(at most 15 letters, digits, '_', '.', ':', '@' or '-')"
            )
        if len(set(names)) != len(names):
            raise ValueError("interfaces: each name once")
        return names

    @model_validator(mode="after")
    def _rate_fits_share(self) -> Self:
        if self.line_rate is not None and parse_quantity(self.line_rate) < self.share.min_bps:
            raise ValueError("lineRate must be at least share.min")
        return self

    @property
    def line_rate_bps(self) -> int | None:
        return parse_quantity(self.line_rate) if self.line_rate is not None else None


class NetworkSharingPolicyStatus(KubeModel):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    nodes: int = 0
    nics: int = 0
    missing: list[str] = Field(
        default_factory=list, max_length=50, description="node/interface pairs selected but not found"
    )


class NetworkSharingPolicy(KubeModel):
    """A whole NetworkSharingPolicy object, as read from a file or the API."""

    api_version: Literal["tessera.dev/v1alpha1"] = "tessera.dev/v1alpha1"
    kind: Literal["NetworkSharingPolicy"] = "NetworkSharingPolicy"
    metadata: ObjectMeta
    spec: NetworkSharingPolicySpec
    status: NetworkSharingPolicyStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name
