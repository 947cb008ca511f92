"""SharingPolicies from a hypothesis generator, valid and not, tried against a real apiserver
and a running operator: each must be refused at admission with a message that names the
field, or accepted and then given a status (at its generation) whose ``Ready`` condition, or
``Degraded`` when true, carries a reason. Shared by the bounded integration test
(``tests/integration/test_policy_fuzz.py``) and the 10,000-policy benchmark
(``benchmarks/bench_policy_fuzz.py``). Not a test module itself.

The generator mixes, per field, values the API takes with values it must refuse (unknown
profiles, counts out of range, malformed quantities, unsorted lists, operators without values,
wrong types, unknown fields, CEL that does not compile or fails at run time), so most specs
are wrong in zero, one or a few places. Examples are drawn in a batch (``draw_specs``, seeded:
the same seed gives the same specs) rather than one test per example, because the operator's
side is judged on a batch at a time.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tessera.kube.http import ApiError, KubeClient, resource_path
from tessera.models.catalog import KNOWN_PROFILE_NAMES

POLICIES = resource_path("tessera.dev", "v1alpha1", "sharingpolicies")
BATCH_LABEL = "tessera.dev/fuzz-batch"
NODE_LABELS = {"pool": "fuzz"}
ATTR = 'device.attributes["gpu.tessera.dev"]'
# Reasons that say "not there yet": a policy showing one is waited for.
TRANSIENT = {"Applying", "Draining"}
# A field path as the apiserver writes it: spec.mps.memory.min, spec.nodeSelector.matchExpressions[0].values
FIELD_PATH = re.compile(r"\bspec(\.[A-Za-z][A-Za-z0-9]*(\[\d+\]|\[[^\]]*\])?)*")


def _maybe(strategy: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a good value, sometimes a bad one."""
    return st.one_of(strategy, strategy, strategy, bad)


_QUANTITY = _maybe(st.sampled_from(["1Gi", "2Gi", "4Gi", "8Gi", "512Mi", "1500Mi", "1G", "0"]),
                   st.one_of(st.sampled_from(["four", "-1Gi", "1.5.5Gi", "1GiB", "Gi", ""]), st.integers(-2, 3)))
_PROFILE_NAMES = st.sampled_from([*KNOWN_PROFILE_NAMES, "9g.99gb", "1g.5gb ", "half", "7g.80GB"])
_STRATEGIES = ["Exclusive", "MIG", "DynamicMIG", "TimeSlicing", "MPS"]
_CEL_GOOD = [
    f"{ATTR}.index == 0",
    f"{ATTR}.index >= 1",
    f'{ATTR}.productName.startsWith("NVIDIA H100")',
    f'{ATTR}.architecture == "Ampere"',
    'device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) > 0',
    "true",
]
_CEL_BAD = [
    "this is not CEL (",
    f"{ATTR}.noSuchAttribute == 1",  # compiles, fails when evaluated
    '1 + "one"',  # does not type-check
    f"{ATTR}.index",  # not a bool
    "",
]


def _mig() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={
        "profiles": _maybe(st.dictionaries(st.sampled_from(list(KNOWN_PROFILE_NAMES)), st.integers(1, 3), max_size=4),
                           st.one_of(st.dictionaries(_PROFILE_NAMES, st.integers(-1, 9), max_size=8),
                                     st.just("all"))),
        "preset": _maybe(st.sampled_from(["all-1g", "all-balanced", "whole"]), st.sampled_from(["half", "", 7])),
        "sharing": st.fixed_dictionaries({"strategy": _maybe(st.sampled_from(["MPS", "TimeSlicing"]),
                                                             st.sampled_from(["Exclusive", "mps"]))}),
    })


def _time_slicing() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={
        "replicas": _maybe(st.integers(2, 64), st.one_of(st.integers(-1, 1), st.integers(65, 100), st.just("4"))),
        "interval": _maybe(st.sampled_from(["Default", "Short", "Medium", "Long"]), st.just("Fast")),
    })


def _mps() -> st.SearchStrategy[dict[str, Any]]:
    memory = st.fixed_dictionaries({}, optional={"default": _QUANTITY, "min": _QUANTITY, "step": _QUANTITY})
    compute = st.fixed_dictionaries({}, optional={
        "default": _maybe(st.sampled_from([10, 25, 50, 100]), st.integers(-5, 120)),
        "values": _maybe(st.sampled_from([[10, 25, 50, 100], [10], [10, 20, 30]]),
                         st.lists(st.integers(-5, 120), max_size=12)),
    })
    return st.fixed_dictionaries({}, optional={
        "memory": memory, "compute": compute,
        "maxClients": _maybe(st.integers(1, 48), st.integers(-1, 100)),
    })


def _node_selector() -> st.SearchStrategy[dict[str, Any]]:
    expression = st.fixed_dictionaries(
        {"key": _maybe(st.sampled_from(["pool", "kubernetes.io/hostname", "gpu"]), st.just("")),
         "operator": _maybe(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]), st.just("Equals"))},
        optional={"values": st.lists(st.sampled_from(["fuzz", "other", "a"]), max_size=3)},
    )
    return st.fixed_dictionaries({}, optional={
        "matchLabels": st.dictionaries(st.sampled_from(["pool", "gpu"]), st.sampled_from(["fuzz", "other"]),
                                       max_size=2),
        "matchExpressions": st.lists(expression, max_size=3),
    })


@st.composite
def _coherent(draw: st.DrawFn) -> dict[str, Any]:
    """A spec whose blocks fit its strategy (most values good: the admission checks that are
    left are the ones inside a block; a CEL selector may still fail only at run time)."""
    strategy = draw(st.sampled_from(_STRATEGIES))
    spec: dict[str, Any] = {"strategy": strategy, "priority": draw(st.integers(0, 1000))}
    if draw(st.booleans()):
        spec["nodeSelector"] = {"matchLabels": dict(NODE_LABELS)}
    if draw(st.integers(0, 3)) == 0:
        spec["gpuSelector"] = {"cel": draw(st.sampled_from([*_CEL_GOOD, *_CEL_BAD[:2]]))}
    share = None
    if strategy == "MIG":
        mig: dict[str, Any] = draw(st.one_of(
            st.fixed_dictionaries({"profiles": st.dictionaries(st.sampled_from(list(KNOWN_PROFILE_NAMES)),
                                                               st.integers(1, 3), min_size=1, max_size=3)}),
            st.fixed_dictionaries({"preset": st.sampled_from(["all-1g", "all-balanced", "whole"])})))
        if draw(st.booleans()):
            share = draw(st.sampled_from(["MPS", "TimeSlicing"]))
            mig["sharing"] = {"strategy": share}
        spec["mig"] = mig
    if (strategy == "TimeSlicing" or share == "TimeSlicing") and draw(st.booleans()):
        spec["timeSlicing"] = draw(_time_slicing())
    if (strategy == "MPS" or share == "MPS") and draw(st.booleans()):
        spec["mps"] = draw(_mps())
    if draw(st.integers(0, 3)) == 0:
        spec["drain"] = {"mode": draw(st.sampled_from(["Wait", "Evict"])), "timeout": "30m"}
    return spec


def policy_specs() -> st.SearchStrategy[dict[str, Any]]:
    """A SharingPolicy spec, valid or not: half fit their strategy, half are thrown together."""
    return st.one_of(_coherent(), _thrown_together())


def _thrown_together() -> st.SearchStrategy[dict[str, Any]]:
    spec = st.fixed_dictionaries({}, optional={
        "priority": _maybe(st.integers(0, 1000), st.one_of(st.integers(-5, -1), st.just(2_000_000), st.just("high"))),
        "nodeSelector": _node_selector(),
        "gpuSelector": st.fixed_dictionaries({"cel": _maybe(st.sampled_from(_CEL_GOOD), st.sampled_from(_CEL_BAD))}),
        "strategy": _maybe(st.sampled_from(_STRATEGIES), st.sampled_from(["Shared", "mig", ""])),
        "mig": _mig(),
        "timeSlicing": _time_slicing(),
        "mps": _mps(),
        "drain": st.fixed_dictionaries({}, optional={
            "mode": _maybe(st.sampled_from(["Wait", "Evict"]), st.just("Never")),
            "timeout": _maybe(st.sampled_from(["1h", "30m", "90s", "1h30m"]), st.sampled_from(["10x", "-1h", ""])),
        }),
    })
    unknown = st.sampled_from([{}, {}, {}, {}, {"replicas": 2}, {"mig": {"profile": "1g.10gb"}}])
    return st.builds(_merge_unknown, spec, unknown)


def _merge_unknown(spec: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with a field the schema does not have (strict field validation refuses it)."""
    out = dict(spec)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def draw_specs(count: int, random_seed: int) -> list[dict[str, Any]]:
    """``count`` specs (fewer if the generator runs dry), the same for the same seed."""
    drawn: list[dict[str, Any]] = []

    @seed(random_seed)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(policy_specs())
    def collect(spec: dict[str, Any]) -> None:
        drawn.append(spec)

    collect()
    return drawn


# --- trying them ---------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    spec: dict[str, Any]
    refused: str | None = None  # the apiserver's message
    generation: int = 0
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """``refused <first field>``, ``Ready <reason>`` or ``Degraded <reason>``."""
        if self.refused is not None:
            paths = [m.group(0) for m in FIELD_PATH.finditer(self.refused)]
            return f"refused {_generic(max(paths, key=len)) if paths else '(no field named)'}"
        conditions = {c["type"]: c for c in self.status.get("conditions", [])}
        degraded = conditions.get("Degraded", {})
        if degraded.get("status") == "True":
            return f"Degraded {degraded.get('reason', '')}"
        ready = conditions.get("Ready", {})
        return f"Ready={ready.get('status', '?')} {ready.get('reason', '(no status)')}"

    def problem(self) -> str | None:
        """What is wrong with this outcome, or None."""
        if self.refused is not None:
            return None if FIELD_PATH.search(self.refused) else f"refused without naming a field: {self.refused}"
        if self.status.get("observedGeneration") != self.generation:
            return f"no status for generation {self.generation}: {self.status}"
        conditions = {c["type"]: c for c in self.status.get("conditions", [])}
        ready = conditions.get("Ready")
        if ready is None or not ready.get("reason"):
            return f"no Ready condition with a reason: {self.status}"
        if ready["reason"] in TRANSIENT:
            return f"still {ready['reason']} when the batch timed out: {self.status}"
        degraded = conditions.get("Degraded", {})
        if degraded.get("status") == "True" and not (degraded.get("reason") and degraded.get("message")):
            return f"Degraded without a reason and message: {degraded}"
        if ready.get("status") != "True" and not ready.get("message"):
            return f"not Ready and no message saying why: {ready}"
        return None

    @property
    def settled(self) -> bool:
        if self.refused is not None:
            return True
        if self.status.get("observedGeneration") != self.generation:
            return False
        ready = {c["type"]: c for c in self.status.get("conditions", [])}.get("Ready", {})
        return bool(ready.get("reason")) and ready.get("reason") not in TRANSIENT


def _generic(path: str) -> str:
    return re.sub(r"\[[^\]]*\]", "[]", path)


def policy_object(name: str, batch: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "tessera.dev/v1alpha1", "kind": "SharingPolicy",
            "metadata": {"name": name, "labels": {BATCH_LABEL: batch}}, "spec": spec}


async def submit(api: KubeClient, name: str, batch: str, spec: dict[str, Any]) -> Outcome:
    """Create one policy as ``kubectl apply`` would (strict field validation)."""
    outcome = Outcome(name, spec)
    try:
        created = await api.request("POST", POLICIES, params={"fieldValidation": "Strict"},
                                    body=policy_object(name, batch, spec))
        outcome.generation = int(created["metadata"].get("generation", 1))
    except ApiError as e:
        if e.status not in (400, 422):
            raise
        outcome.refused = e.message
    return outcome


async def try_batch(api: KubeClient, specs: list[dict[str, Any]], batch: str, timeout_s: float = 180.0,
                    concurrency: int = 16) -> list[Outcome]:
    """Create every spec, wait until the operator has settled each accepted one (or the
    timeout), then delete the batch and wait until it is gone."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, spec: dict[str, Any]) -> Outcome:
        async with gate:
            return await submit(api, f"fz-{batch}-{i}", batch, spec)

    outcomes = list(await asyncio.gather(*(one(i, s) for i, s in enumerate(specs))))
    accepted = {o.name: o for o in outcomes if o.refused is None}
    deadline = time.monotonic() + timeout_s
    while accepted:
        for item in await api.list(POLICIES, label_selector=f"{BATCH_LABEL}={batch}"):
            if item["metadata"]["name"] in accepted:
                accepted[item["metadata"]["name"]].status = item.get("status") or {}
        if all(o.settled for o in accepted.values()) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    await api.request("DELETE", POLICIES, params={"labelSelector": f"{BATCH_LABEL}={batch}"})
    while await api.list(POLICIES, label_selector=f"{BATCH_LABEL}={batch}"):
        if time.monotonic() > deadline + 120:
            raise TimeoutError(f"batch {batch}: policies still there 120 s after their deletion")
        await asyncio.sleep(0.5)
    return outcomes


def summary(outcomes: list[Outcome]) -> Counter[str]:
    return Counter(o.kind for o in outcomes)


def log_problems(log_text: str) -> list[str]:
    """Lines of the operator's log that tell of an unhandled exception or an error."""
    bad = []
    for line in log_text.splitlines():
        lowered = line.lower()
        if ("traceback" in lowered or '"exception"' in lowered or '"level": "error"' in lowered
                or '"level": "critical"' in lowered or '"level":"error"' in lowered):
            bad.append(line[:500] + (f" ... {line[-800:]}" if len(line) > 500 else ""))
    return bad
