"""Benchmark: what Kopf's diff base costs the operator on every ResourceClaim event, against the
storage the operator gives Kopf (``tessera.controller.handlers.EventsOnlyDiffBase``).

    .venv/bin/python benchmarks/bench_kopf_events.py [--rounds 20000]

Before it calls any handler, Kopf reads the stored diff base of the object and builds a new one
(a deep copy of the whole body, status included, less some metadata), then diffs the two: the
steps of ``kopf._core.reactor.processing._detect_causes`` that serve on.create/on.update/
on.field handlers only. The operator registers none (``kopf.on.event`` only), so those steps are
pure cost on every event of every claim, each agent's claim-check ask and the operator's answer
among them. This runs exactly those steps, as Kopf calls them, on two bodies: a node's fence
claim carrying an ask and an answer naming 8 claims, and a claim allocated one device and
reserved for a Pod. Prints microseconds per event for Kopf's annotations storage (what the
operator used before) and for the events-only one. Not a test: it prints figures and asserts
nothing.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import kopf
from kopf._cogs.structs import bodies, diffs

from tessera import API_GROUP, DRIVER_NAME, INSTALL_NAMESPACE
from tessera.controller.handlers import EventsOnlyDiffBase
from tessera.kube.claims import ANSWER_ANNOTATION, ASK_ANNOTATION, NODE_ANNOTATION
from tessera.models.claimcheck import ClaimCheckAnswer


def fence_claim() -> dict[str, Any]:
    node = "bench-00042"
    held = {f"team-{i}/train-{i}": (f"gpu-{i}",) for i in range(8)}
    answer = ClaimCheckAnswer.of("boot-1/17", node, held.items()).encode()
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"tessera-fence-{node}", "namespace": INSTALL_NAMESPACE, "uid": "u-1",
                     "resourceVersion": "123456", "generation": 1, "creationTimestamp": "2026-12-07T12:00:00Z",
                     "annotations": {ASK_ANNOTATION: "boot-1/17", NODE_ANNOTATION: node, ANSWER_ANNOTATION: answer},
                     "managedFields": [{"manager": "tessera-agent", "operation": "Update",
                                        "apiVersion": "resource.k8s.io/v1", "fieldsType": "FieldsV1",
                                        "fieldsV1": {"f:metadata": {"f:annotations": {}}}}]},
        "spec": {"devices": {"requests": []}},
    }


def allocated_claim() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "train-7-gpu", "namespace": "team-7", "uid": "u-2", "resourceVersion": "123457",
                     "generation": 1, "creationTimestamp": "2026-12-07T12:00:00Z",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "train-7", "uid": "p-7",
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "mig.tessera.dev", "allocationMode": "ExactCount", "count": 1,
            "selectors": [{"cel": {"expression": "device.attributes['tessera.dev'].migProfile == '3g.40gb'"}}]}}]}},
        "status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": "bench-00042",
                                                    "device": "gpu-3-mig-3g40gb-4"}]},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In", "values": ["bench-00042"]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "train-7", "uid": "p-7"}],
        },
    }


def per_event(storage: kopf.DiffBaseStorage, progress: kopf.ProgressStorage, raw: dict[str, Any],
              rounds: int) -> float:
    """Microseconds per event of Kopf's diff-base steps, as ``_detect_causes`` runs them."""
    body = bodies.Body(raw)
    start = time.perf_counter()
    for _ in range(rounds):
        old = storage.fetch(body=body)
        new = storage.build(body=body, extra_fields=set())
        old = progress.clear(essence=old) if old is not None else None
        new = progress.clear(essence=new) if new is not None else None
        diffs.diff(old, new)
    return (time.perf_counter() - start) / rounds * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    progress = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    storages: dict[str, kopf.DiffBaseStorage] = {
        "Kopf's annotations storage (before)": kopf.AnnotationsDiffBaseStorage(
            prefix=API_GROUP, key="last-handled-configuration"),
        "events-only (the operator's)": EventsOnlyDiffBase(),
    }
    for title, raw in (("fence claim, ask + answer of 8 claims", fence_claim()),
                       ("claim allocated one device, reserved", allocated_claim())):
        for name, storage in storages.items():
            per_event(storage, progress, raw, args.rounds // 10)  # warm up
            print(f"{title:40} {name:38} {per_event(storage, progress, raw, args.rounds):7.1f} us/event",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
