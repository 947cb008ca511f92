"""The apiserver's ResourceSlice rules (``resource.k8s.io/v1``, Kubernetes 1.36), checked offline
by the unit tests: a quick, readable net under the slice builders. The check of record is the
real apiserver (``tests/integration/test_publisher_admission.py`` creates the slices, and its
server-side validation refuses what breaks these rules); this module only lets the unit tests
say which rule a builder broke without a cluster.

A subset of ``pkg/apis/resource/validation`` that Tessera's slices can break: devices xor
counters, device counts (128, 64 with taints or counter consumption), attributes+capacities
per device (32), names, attribute values, ``requestPolicy`` (only with
``allowMultipleAllocations``; ``validValues`` ≤ 10, sorted, holding the default, within the
capacity; ``validRange`` min ≤ default ≤ max ≤ capacity, ``min + step`` ≤ capacity, default
and max on a step from min), taints (≤ 16, known effects), counters (≤ 8 sets per slice,
≤ 32 counters per set, ≤ 2 consumptions per device, ≤ 32 counters each), and pool-wide:
device names and counter set names unique, consumed counters defined and never overdrawn by
one device, one generation and a slice count that matches.
Each function returns readable problems; an empty list means the apiserver would take it.
Not for: building slices (``tessera.dra.slices``, which owns the device-count limits it chunks by).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from tessera.dra.slices import MAX_DEVICES, MAX_DEVICES_WITH_ADVANCED_FEATURES
from tessera.models.quantity import quantity_value

MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_TAINTS = 16
MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_VALID_VALUES = 10
TAINT_EFFECTS = frozenset({"None", "NoSchedule", "NoExecute"})

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)
def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and _DNS_LABEL.match(name) is not None


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and _DNS_SUBDOMAIN.match(name) is not None


def is_qualified_name(name: str) -> bool:
    """A C identifier (≤ 32), optionally after a DNS subdomain (≤ 63) and a slash."""
    domain, _, ident = name.rpartition("/")
    if domain and (len(domain) > 63 or not is_dns_subdomain(domain)):
        return False
    return len(ident) <= 32 and _C_IDENTIFIER.match(ident) is not None


def _check_attribute(where: str, value: Any) -> list[str]:
    if not isinstance(value, dict) or len(value) != 1:
        return [f"{where}: exactly one value must be specified"]
    ((kind, item),) = value.items()
    if kind not in ("int", "bool", "string", "version"):
        return [f"{where}: unknown attribute type {kind!r}"]
    if kind in ("string", "version") and len(str(item)) > MAX_ATTRIBUTE_VALUE_LENGTH:
        return [f"{where}: longer than {MAX_ATTRIBUTE_VALUE_LENGTH} characters"]
    if kind == "version" and not _SEMVER.match(str(item)):
        return [f"{where}: {item!r} is not a semantic version"]
    if kind == "int" and (not isinstance(item, int) or isinstance(item, bool)):
        return [f"{where}: {item!r} is not an integer"]
    if kind == "bool" and not isinstance(item, bool):
        return [f"{where}: {item!r} is not a bool"]
    return []


def _check_on_step(where: str, what: str, value: Fraction, low: Fraction, step: Fraction) -> list[str]:
    if step > 0 and (value - low) % step:
        return [f"{where}: {what} {value} is not min plus a whole number of steps ({step})"]
    return []


def _check_policy(where: str, total: Fraction, policy: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    values = policy.get("validValues") or []
    valid_range = policy.get("validRange")
    if values and valid_range is not None:
        return [f"{where}: validValues and validRange cannot both be set"]
    default = policy.get("default")
    if (values or valid_range is not None) and default is None:
        return [f"{where}: default is required with validValues or validRange"]
    if values:
        numbers = [quantity_value(v) for v in values]
        if len(numbers) > MAX_VALID_VALUES:
            problems.append(f"{where}: more than {MAX_VALID_VALUES} validValues")
        if numbers != sorted(numbers) or len(set(numbers)) != len(numbers):
            problems.append(f"{where}: validValues must be sorted and unique")
        if any(n > total for n in numbers):
            problems.append(f"{where}: a valid value exceeds the capacity {total}")
        if quantity_value(str(default)) not in numbers:
            problems.append(f"{where}: default {default} is not among validValues")
    elif valid_range is not None:
        if valid_range.get("min") is None:
            return [f"{where}: validRange.min is required"]
        low, dflt = quantity_value(valid_range["min"]), quantity_value(str(default))
        high = quantity_value(valid_range["max"]) if valid_range.get("max") is not None else None
        step = quantity_value(valid_range["step"]) if valid_range.get("step") is not None else None
        if low > total:
            problems.append(f"{where}: min {low} exceeds the capacity {total}")
        if dflt < low:
            problems.append(f"{where}: default {dflt} is below min {low}")
        if high is not None:
            if low > high:
                problems.append(f"{where}: min {low} exceeds max {high}")
            if high > total:
                problems.append(f"{where}: max {high} exceeds the capacity {total}")
            if dflt > high:
                problems.append(f"{where}: default {dflt} exceeds max {high}")
        if step is not None:
            if step <= 0:
                problems.append(f"{where}: step must be positive")
            if low + step > total:
                problems.append(f"{where}: min + step ({low + step}) exceeds the capacity {total}")
            problems += _check_on_step(where, "default", dflt, low, step)
            if high is not None:
                problems += _check_on_step(where, "max", high, low, step)
    return problems


def _check_counters(where: str, counters: Any, limit: int) -> list[str]:
    if not isinstance(counters, dict) or not counters:
        return [f"{where}: counters are required"]
    problems = [f"{where}: counter name {n!r} is not a DNS label" for n in counters if not is_dns_label(n)]
    if len(counters) > limit:
        problems.append(f"{where}: {len(counters)} counters, at most {limit}")
    for name, counter in counters.items():
        try:
            quantity_value(counter["value"])
        except (KeyError, TypeError, ValueError):
            problems.append(f"{where}.{name}: value must be a quantity")
    return problems


def validate_device(device: dict[str, Any], where: str = "device") -> list[str]:
    """The problems the apiserver would find in one device."""
    name = str(device.get("name", ""))
    where = f"{where} {name!r}"
    problems: list[str] = []
    if not is_dns_label(name):
        problems.append(f"{where}: name must be a DNS label")
    attributes: dict[str, Any] = device.get("attributes") or {}
    capacity: dict[str, Any] = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(f"{where}: {len(attributes) + len(capacity)} attributes and capacities, at most 32")
    for key, value in attributes.items():
        if not is_qualified_name(key):
            problems.append(f"{where}: attribute name {key!r} is not a qualified name")
        problems += _check_attribute(f"{where}.attributes[{key}]", value)
    shared = device.get("allowMultipleAllocations") is True
    for key, cap in capacity.items():
        if not is_qualified_name(key):
            problems.append(f"{where}: capacity name {key!r} is not a qualified name")
        try:
            total = quantity_value(cap["value"])
        except (KeyError, TypeError, ValueError):
            problems.append(f"{where}.capacity[{key}]: value must be a quantity")
            continue
        policy = cap.get("requestPolicy")
        if policy is not None:
            if not shared:
                problems.append(f"{where}.capacity[{key}]: requestPolicy needs allowMultipleAllocations: true")
            problems += _check_policy(f"{where}.capacity[{key}].requestPolicy", total, policy)
    taints = device.get("taints") or []
    if len(taints) > MAX_TAINTS:
        problems.append(f"{where}: {len(taints)} taints, at most {MAX_TAINTS}")
    for taint in taints:
        if taint.get("effect") not in TAINT_EFFECTS:
            problems.append(f"{where}: taint effect {taint.get('effect')!r} is not None, NoSchedule or NoExecute")
        if not taint.get("key"):
            problems.append(f"{where}: a taint needs a key")
    consumes = device.get("consumesCounters") or []
    if len(consumes) > MAX_CONSUMPTIONS_PER_DEVICE:
        problems.append(f"{where}: {len(consumes)} counter consumptions, at most {MAX_CONSUMPTIONS_PER_DEVICE}")
    sets = [c.get("counterSet") for c in consumes]
    if len(set(sets)) != len(sets):
        problems.append(f"{where}: one counterSet consumed twice")
    for c in consumes:
        problems += _check_counters(f"{where}.consumesCounters[{c.get('counterSet')}]", c.get("counters"),
                                    MAX_COUNTERS_PER_CONSUMPTION)  # fmt: skip
    return problems


def _limit_for(devices: Sequence[dict[str, Any]]) -> int:
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    return MAX_DEVICES_WITH_ADVANCED_FEATURES if advanced else MAX_DEVICES


def validate_slice(resource_slice: dict[str, Any]) -> list[str]:
    """The problems the apiserver would find in one ResourceSlice on its own."""
    name = str(resource_slice.get("metadata", {}).get("name", ""))
    where = f"slice {name!r}"
    problems: list[str] = []
    if not is_dns_subdomain(name):
        problems.append(f"{where}: name must be a DNS subdomain of at most 253 characters")
    spec: dict[str, Any] = resource_slice.get("spec") or {}
    driver = str(spec.get("driver", ""))
    if not driver or len(driver) > 63 or not is_dns_subdomain(driver):
        problems.append(f"{where}: driver must be a DNS subdomain of at most 63 characters")
    pool = spec.get("pool") or {}
    pool_name = str(pool.get("name", ""))
    if not pool_name or len(pool_name) > 253 or not all(is_dns_subdomain(p) for p in pool_name.split("/")):
        problems.append(f"{where}: pool.name must be DNS subdomains separated by slashes, at most 253 characters")
    if int(pool.get("resourceSliceCount", 0)) <= 0:
        problems.append(f"{where}: pool.resourceSliceCount must be greater than zero")
    if int(pool.get("generation", -1)) < 0:
        problems.append(f"{where}: pool.generation must be zero or more")
    node_name = spec.get("nodeName")
    if node_name is not None and not is_dns_subdomain(str(node_name)):
        problems.append(f"{where}: nodeName must be a DNS subdomain")
    selections = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)]
    if len(selections) != 1:
        problems.append(f"{where}: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection")
    devices: list[dict[str, Any]] = spec.get("devices") or []
    counter_sets: list[dict[str, Any]] = spec.get("sharedCounters") or []
    if devices and counter_sets:
        problems.append(f"{where}: only one of devices or sharedCounters is allowed")
    limit = _limit_for(devices)
    if len(devices) > limit:
        problems.append(f"{where}: {len(devices)} devices, at most {limit}")
    names = [d.get("name") for d in devices]
    if len(set(names)) != len(names):
        problems.append(f"{where}: device names must be unique")
    for device in devices:
        problems += validate_device(device, where)
    if len(counter_sets) > MAX_COUNTER_SETS:
        problems.append(f"{where}: {len(counter_sets)} counter sets, at most {MAX_COUNTER_SETS}")
    for counter_set in counter_sets:
        set_name = str(counter_set.get("name", ""))
        if not is_dns_label(set_name):
            problems.append(f"{where}: counter set name {set_name!r} is not a DNS label")
        problems += _check_counters(f"{where}.sharedCounters[{set_name}]", counter_set.get("counters"),
                                    MAX_COUNTERS_PER_SET)  # fmt: skip
    return problems


def validate_pool(slices: Sequence[dict[str, Any]]) -> list[str]:
    """Each slice's problems, then the pool's: what the scheduler would call an invalid pool."""
    problems = [p for s in slices for p in validate_slice(s)]
    if not slices:
        return problems
    pools = {(s["spec"].get("driver"), s["spec"]["pool"].get("name")) for s in slices}
    if len(pools) != 1:
        return [*problems, f"slices of {len(pools)} pools given, expected one"]
    generations = {s["spec"]["pool"].get("generation") for s in slices}
    if len(generations) != 1:
        problems.append(f"pool: slices carry different generations {sorted(generations)}")
    counts = {s["spec"]["pool"].get("resourceSliceCount") for s in slices}
    if counts != {len(slices)}:
        problems.append(f"pool: resourceSliceCount {sorted(counts)} but {len(slices)} slices")
    seen: set[str] = set()
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if d["name"] in seen:
                problems.append(f"pool: device name {d['name']!r} is published twice")
            seen.add(d["name"])
    counter_sets: dict[str, dict[str, Fraction]] = {}
    for s in slices:
        for cs in s["spec"].get("sharedCounters") or []:
            if cs["name"] in counter_sets:
                problems.append(f"pool: counter set {cs['name']!r} is defined twice")
            counter_sets[cs["name"]] = {k: quantity_value(v["value"]) for k, v in cs["counters"].items()}
    for s in slices:
        for d in s["spec"].get("devices") or []:
            for c in d.get("consumesCounters") or []:
                available = counter_sets.get(c["counterSet"])
                if available is None:
                    problems.append(f"pool: device {d['name']!r} consumes undefined counter set {c['counterSet']!r}")
                    continue
                for counter, amount in c["counters"].items():
                    if counter not in available:
                        problems.append(f"pool: device {d['name']!r} consumes undefined counter {counter!r}")
                    elif quantity_value(amount["value"]) > available[counter]:
                        problems.append(f"pool: device {d['name']!r} needs more {counter!r} than exists")
    return problems
