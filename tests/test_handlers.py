"""The operator's Kopf handlers are event handlers only, so Kopf's diff base can be skipped:
``EventsOnlyDiffBase`` builds, reads and stores nothing, and tells Kopf of no change."""

from __future__ import annotations

import copy

import kopf
from kopf._cogs.structs import bodies, diffs, patches
from kopf._cogs.structs.references import Resource

from tessera.controller.handlers import EventsOnlyDiffBase, configure, registry
from tessera.kube.claims import FENCE_LABEL

CLAIM = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
    "metadata": {"name": "c", "namespace": "ns", "annotations": {"tessera.dev/claim-check": "boot/1"},
                 "labels": {"team": "a"}},
    "spec": {"devices": {"requests": [{"name": "gpu"}]}},
    "status": {"allocation": {"devices": {"results": [{"driver": "gpu.tessera.dev", "pool": "n", "device": "gpu-0"}]}}},
}


def test_the_operator_registers_event_handlers_only() -> None:
    # What EventsOnlyDiffBase relies on: no handler that asks Kopf what changed.
    assert registry._changing.get_all_handlers() == []
    assert registry._spawning.get_all_handlers() == []
    watched = {h.selector.any_name for h in registry._watching.get_all_handlers() if h.selector is not None}
    assert watched == {"resourceclaims", "sharingpolicies"}


def test_the_events_only_diff_base_builds_nothing_and_tells_no_change() -> None:
    storage = EventsOnlyDiffBase()
    body = bodies.Body(copy.deepcopy(CLAIM))
    old = storage.fetch(body=body)
    new = storage.build(body=body, extra_fields=set())
    assert old == {}
    assert new == {}
    assert not diffs.diff(old, new)
    patch = patches.Patch()
    storage.store(body=body, patch=patch, essence=new)
    assert not patch  # Kopf writes nothing to the object
    assert dict(body) == CLAIM  # and nothing of it was touched


def test_kopf_watches_and_lists_every_claim_but_the_fence_claims() -> None:
    # Kopf puts these selectors on its watch and list requests (kopf._cogs.clients.watching and
    # fetching: ``settings.watching.label_selectors.collect(resource)``): the apiserver leaves
    # the fence claims out of Kopf's stream, and nothing else Kopf watches.
    settings = kopf.OperatorSettings()
    configure(settings)
    claims = Resource(group="resource.k8s.io", version="v1", plural="resourceclaims", kind="ResourceClaim")
    policies = Resource(group="tessera.dev", version="v1alpha1", plural="sharingpolicies", kind="SharingPolicy")
    assert settings.watching.label_selectors.collect(claims) == [f"!{FENCE_LABEL}"]
    assert settings.watching.label_selectors.collect(policies) == []
    assert settings.watching.field_selectors.collect(claims) == []
