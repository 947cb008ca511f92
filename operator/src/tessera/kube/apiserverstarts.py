"""Which kube-apiservers started recently, read from their identity Leases: the outages an
operator process cannot have seen because they were over before it started.

Every kube-apiserver (APIServerIdentity, on by default since 1.26) keeps a Lease in
``kube-system`` labelled ``apiserver.kubernetes.io/identity=kube-apiserver``, renewed every
10 s. The lease controller of the Kubernetes this project runs (1.36, component-helpers)
deletes it when the apiserver starts and creates it afresh, so its ``creationTimestamp`` is when
that instance began to serve (a release whose controller only renews the Lease leaves the old
timestamp, and then no start is seen here: the agent's check and ``MissingDevice`` remain). Its
``renewTime`` minus its ``creationTimestamp`` (both the apiserver's own clock, so no clock skew
enters) is how long it had served at its last renewal: never more than its age now, so a wait
counted from it is never cut short.

The handover (``tessera.controller.handover``) waits after an outage until kube-scheduler's
informers can be back; a process that started after the outage ended did not see it, but the
apiserver's start tells it that one ended then. An apiserver that started before anything of
ours existed (a new cluster) cannot have cut a scheduler off from a view of our slices, so
only starts after ``existed_since`` count.
Not for: leader election (``tessera.kube.lease``) or the outages this client saw
(``tessera.kube.outages``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tessera.kube.http import resource_path
from tessera.models.conditions import parse_rfc3339

IDENTITY_SELECTOR = "apiserver.kubernetes.io/identity=kube-apiserver"
LEASES = resource_path("coordination.k8s.io", "v1", "leases", namespace="kube-system")


def started_ago(leases: Iterable[Mapping[str, Any]], existed_since: str | None) -> list[float]:
    """For each apiserver whose identity Lease was created after ``existed_since`` (the
    creationTimestamp of the oldest object of ours; None: nothing of ours existed): how many
    seconds it had served at its last renewal, at least (no more than its age now). Leases
    without both times are skipped."""
    since = parse_rfc3339(existed_since)
    if since is None:
        return []
    ages = []
    for lease in leases:
        created = parse_rfc3339((lease.get("metadata") or {}).get("creationTimestamp"))
        renewed = parse_rfc3339((lease.get("spec") or {}).get("renewTime"))
        if created is None or renewed is None or created <= since:
            continue
        # creationTimestamp is whole seconds (the start was up to 1 s later than it reads): an
        # age of "renewed - created" would be up to 1 s too long, so take that second off.
        ages.append(max(0.0, (renewed - created).total_seconds() - 1.0))
    return ages
