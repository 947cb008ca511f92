"""The shared table of SharingPolicies: invalid ones with the words each checker must say, and
valid ones. The pydantic models (unit tests) and the apiserver's schema and CEL rules
(integration test) are held to the same table, so the two checkers cannot drift apart.
Not a test module itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InvalidPolicy:
    """A spec both checkers refuse. ``message`` is a fragment both say (the cross-field rules
    share their wording); ``apiserver`` overrides it where the apiserver words a schema check
    its own way. ``field`` is the path both name."""

    id: str
    spec: dict[str, Any]
    field: str
    message: str
    apiserver: str | None = None

    @property
    def apiserver_message(self) -> str:
        return self.apiserver or self.message


_MPS = {"strategy": "MPS"}
_MENU = {
    "layouts": [{"name": "whole"}, {"name": "slices", "strategy": "MIG", "mig": {"preset": "all-1g"}}],
    "idle": "whole",
}

INVALID: tuple[InvalidPolicy, ...] = (
    InvalidPolicy(
        "mig-without-mig-strategy", {"mig": {"preset": "all-1g"}}, "spec", "spec.mig is only allowed with strategy MIG"
    ),
    InvalidPolicy(
        "mig-strategy-without-mig", {"strategy": "MIG"}, "spec", "strategy MIG needs spec.mig with profiles or a preset"
    ),
    InvalidPolicy(
        "mig-profiles-and-preset",
        {"strategy": "MIG", "mig": {"preset": "whole", "profiles": {"7g.80gb": 1}}},
        "spec.mig",
        "spec.mig needs exactly one of profiles or preset",
    ),
    InvalidPolicy(
        "mig-neither-profiles-nor-preset",
        {"strategy": "MIG", "mig": {"sharing": {"strategy": "MPS"}}},
        "spec.mig",
        "spec.mig needs exactly one of profiles or preset",
    ),
    InvalidPolicy(
        "mig-unknown-profile",
        {"strategy": "MIG", "mig": {"profiles": {"9g.99gb": 1, "1g.10gb": 2}}},
        "spec.mig",
        "unknown MIG profile",
    ),
    InvalidPolicy(
        "mig-count-zero",
        {"strategy": "MIG", "mig": {"profiles": {"1g.10gb": 0}}},
        "spec.mig",
        "a MIG profile count must be between 1 and 7",
    ),
    InvalidPolicy(
        "mig-count-eight",
        {"strategy": "MIG", "mig": {"profiles": {"1g.10gb": 8}}},
        "spec.mig",
        "a MIG profile count must be between 1 and 7",
    ),
    InvalidPolicy(
        "mig-unknown-preset",
        {"strategy": "MIG", "mig": {"preset": "half"}},
        "spec.mig.preset",
        "'all-1g', 'all-balanced' or 'whole' (got 'half')",
        apiserver='Unsupported value: "half"',
    ),
    InvalidPolicy(
        "mig-sharing-unknown",
        {"strategy": "MIG", "mig": {"preset": "whole", "sharing": {"strategy": "Vgpu"}}},
        "spec.mig.sharing.strategy",
        "(got 'Vgpu')",
        apiserver='Unsupported value: "Vgpu"',
    ),
    InvalidPolicy(
        "time-slicing-without-strategy",
        {"timeSlicing": {"replicas": 4}},
        "spec",
        "spec.timeSlicing is only allowed with strategy TimeSlicing",
    ),
    InvalidPolicy(
        "mps-with-time-slicing",
        {"strategy": "TimeSlicing", "mps": {}},
        "spec",
        "spec.mps is only allowed with strategy MPS",
    ),
    InvalidPolicy(
        "mps-on-mig-shared-by-time-slicing",
        {"strategy": "MIG", "mig": {"preset": "all-1g", "sharing": {"strategy": "TimeSlicing"}}, "mps": {}},
        "spec",
        "spec.mps is only allowed with strategy MPS or mig.sharing.strategy MPS",
    ),
    InvalidPolicy(
        "mps-default-below-min",
        {**_MPS, "mps": {"memory": {"default": "1Gi", "min": "2Gi"}}},
        "spec.mps.memory",
        "mps.memory.default must be at least mps.memory.min",
    ),
    InvalidPolicy(
        "mps-step-zero",
        {**_MPS, "mps": {"memory": {"step": "0"}}},
        "spec.mps.memory",
        "mps.memory.step must be greater than zero",
    ),
    InvalidPolicy(
        "mps-default-off-step",
        {**_MPS, "mps": {"memory": {"default": "4Gi", "min": "1Gi", "step": "2Gi"}}},
        "spec.mps.memory",
        "mps.memory.default must be mps.memory.min plus a whole number of steps",
    ),
    InvalidPolicy(
        "mps-memory-not-a-quantity",
        {**_MPS, "mps": {"memory": {"default": "lots"}}},
        "spec.mps.memory.default",
        "should match",
    ),
    InvalidPolicy(
        "mps-compute-values-lack-default",
        {**_MPS, "mps": {"compute": {"default": 15, "values": [10, 25]}}},
        "spec.mps.compute",
        "mps.compute.values must contain mps.compute.default",
    ),
    InvalidPolicy(
        "mps-compute-values-unsorted",
        {**_MPS, "mps": {"compute": {"default": 10, "values": [50, 10]}}},
        "spec.mps.compute",
        "mps.compute.values must be sorted",
    ),
    InvalidPolicy(
        "mps-compute-over-100",
        {**_MPS, "mps": {"compute": {"default": 150}}},
        "spec.mps.compute.default",
        "less than or equal to 100",
    ),
    InvalidPolicy(
        "mps-too-many-clients", {**_MPS, "mps": {"maxClients": 64}}, "spec.mps.maxClients", "less than or equal to 48"
    ),
    InvalidPolicy(
        "selector-in-without-values",
        {"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In"}]}},
        "spec.nodeSelector.matchExpressions[0]",
        "operators In and NotIn need values; Exists and DoesNotExist take none",
    ),
    InvalidPolicy(
        "selector-exists-with-values",
        {"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Exists", "values": ["a"]}]}},
        "spec.nodeSelector.matchExpressions[0]",
        "operators In and NotIn need values; Exists and DoesNotExist take none",
    ),
    InvalidPolicy(
        "selector-unknown-operator",
        {"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Gt", "values": ["1"]}]}},
        "spec.nodeSelector.matchExpressions[0].operator",
        "(got 'Gt')",
        apiserver='Unsupported value: "Gt"',
    ),
    InvalidPolicy(
        "unknown-strategy",
        {"strategy": "Bogus"},
        "spec.strategy",
        "'MPS' or 'Adaptive' (got 'Bogus')",
        apiserver='Unsupported value: "Bogus"',
    ),
    InvalidPolicy(
        "adaptive-without-menu",
        {"strategy": "Adaptive"},
        "spec",
        "strategy Adaptive needs spec.adaptive with a menu of layouts",
    ),
    InvalidPolicy(
        "adaptive-menu-on-a-static-strategy",
        {"strategy": "MPS", "adaptive": _MENU},
        "spec",
        "spec.adaptive is only allowed with strategy Adaptive",
    ),
    InvalidPolicy(
        "adaptive-idle-not-on-the-menu",
        {"strategy": "Adaptive", "adaptive": {**_MENU, "idle": "half"}},
        "spec.adaptive",
        "spec.adaptive.idle must name one of spec.adaptive.layouts",
    ),
    InvalidPolicy(
        "adaptive-layout-dynamic-mig",
        {"strategy": "Adaptive", "adaptive": {"layouts": [{"name": "dyn", "strategy": "DynamicMIG"}], "idle": "dyn"}},
        "spec.adaptive.layouts[0]",
        "a layout of spec.adaptive.layouts takes strategy Exclusive, MIG, TimeSlicing or MPS",
    ),
    InvalidPolicy(
        "adaptive-layout-mig-without-profiles",
        {"strategy": "Adaptive", "adaptive": {"layouts": [{"name": "m", "strategy": "MIG"}], "idle": "m"}},
        "spec.adaptive.layouts[0]",
        "strategy MIG needs spec.mig with profiles or a preset",
    ),
    InvalidPolicy(
        "adaptive-layout-mps-fields-on-exclusive",
        {"strategy": "Adaptive", "adaptive": {"layouts": [{"name": "w", "mps": {}}], "idle": "w"}},
        "spec.adaptive.layouts[0]",
        "spec.mps is only allowed with strategy MPS or mig.sharing.strategy MPS",
    ),
    InvalidPolicy(
        "adaptive-no-recuts-allowed",
        {"strategy": "Adaptive", "adaptive": {**_MENU, "maxRecuts": 0}},
        "spec.adaptive.maxRecuts",
        "greater than or equal to 1",
    ),
    InvalidPolicy(
        "adaptive-cooldown-not-a-duration",
        {"strategy": "Adaptive", "adaptive": {**_MENU, "cooldown": "a while"}},
        "spec.adaptive.cooldown",
        "should match",
    ),
    InvalidPolicy("negative-priority", {"priority": -1}, "spec.priority", "greater than or equal to 0"),
    InvalidPolicy(
        "one-replica",
        {"strategy": "TimeSlicing", "timeSlicing": {"replicas": 1}},
        "spec.timeSlicing.replicas",
        "greater than or equal to 2",
    ),
    InvalidPolicy(
        "unknown-interval",
        {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Forever"}},
        "spec.timeSlicing.interval",
        "(got 'Forever')",
        apiserver='Unsupported value: "Forever"',
    ),
    InvalidPolicy("drain-timeout-not-a-duration", {"drain": {"timeout": "soon"}}, "spec.drain.timeout", "should match"),
    InvalidPolicy(
        "drain-unknown-mode",
        {"drain": {"mode": "Now"}},
        "spec.drain.mode",
        "(got 'Now')",
        apiserver='Unsupported value: "Now"',
    ),
    InvalidPolicy(
        "empty-gpu-selector",
        {"gpuSelector": {"cel": ""}},
        "spec.gpuSelector.cel",
        "should have at least 1 character",
        apiserver="should be at least 1 chars long",
    ),
    InvalidPolicy(
        "unknown-field",
        {"strategy": "Exclusive", "sharing": "yes"},
        "spec.sharing",
        "Extra inputs are not permitted",
        apiserver='unknown field "spec.sharing"',
    ),
)

VALID: tuple[tuple[str, dict[str, Any]], ...] = (
    ("empty", {}),
    ("exclusive-with-drain", {"priority": 5, "drain": {"mode": "Evict", "timeout": "30m"}}),
    (
        "mig-profiles",
        {
            "priority": 100,
            "nodeSelector": {
                "matchLabels": {"pool": "inference"},
                "matchExpressions": [
                    {"key": "zone", "operator": "NotIn", "values": ["b"]},
                    {"key": "gpu", "operator": "Exists"},
                ],
            },
            "gpuSelector": {"cel": 'device.attributes["gpu.tessera.dev"].productName.startsWith("NVIDIA H100")'},
            "strategy": "MIG",
            "mig": {"profiles": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
        },
    ),
    (
        "mig-preset-shared-by-mps",
        {
            "strategy": "MIG",
            "mig": {"preset": "all-balanced", "sharing": {"strategy": "MPS"}},
            "mps": {
                "memory": {"default": "4Gi", "min": "1Gi", "step": "1Gi"},
                "compute": {"default": 10, "values": [10, 25, 50, 100]},
            },
        },
    ),
    (
        "mig-shared-by-time-slicing",
        {
            "strategy": "MIG",
            "mig": {"preset": "all-1g", "sharing": {"strategy": "TimeSlicing"}},
            "timeSlicing": {"replicas": 2, "interval": "Short"},
        },
    ),
    ("dynamic-mig", {"strategy": "DynamicMIG"}),
    ("time-slicing", {"strategy": "TimeSlicing", "timeSlicing": {"replicas": 8, "interval": "Long"}}),
    ("mps-defaults", {"strategy": "MPS", "mps": {}}),
    ("mps-odd-steps", {"strategy": "MPS", "mps": {"memory": {"default": "5Gi", "min": "1Gi", "step": "2Gi"}}}),
    (
        "adaptive-menu",
        {
            "strategy": "Adaptive",
            "adaptive": {
                "layouts": [
                    {"name": "whole"},
                    {"name": "balanced", "strategy": "MIG", "mig": {"preset": "all-balanced"}},
                    {"name": "mig-mps", "strategy": "MIG", "mig": {"preset": "whole", "sharing": {"strategy": "MPS"}},
                     "mps": {"compute": {"default": 25, "values": [25, 50, 100]}}},
                    {"name": "notebooks", "strategy": "TimeSlicing", "timeSlicing": {"replicas": 4}},
                ],
                "idle": "whole",
                "cooldown": "10m",
                "maxRecuts": 4,
                "pendingAfter": "3s",
            },
        },
    ),
)


def policy_object(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A whole SharingPolicy object around ``spec``."""
    return {"apiVersion": "tessera.dev/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": name}, "spec": spec}
