"""Kopf handlers: thin adapters from watch events to the :class:`Controller`.

SharingPolicies get create/update/resume/delete handlers (Kopf keeps its small bookkeeping
in ``tessera.dev/`` annotations, never in our structural status); Nodes, NodeLayouts,
ResourceClaims and our ResourceSlices get plain event handlers, which store nothing on the
objects — NodeLayouts can be large, and claims are not ours to annotate. Settings live in the one startup handler.
Not for: logic (``decide``, ``policystatus``) or API writes (``runtime``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from tessera import API_GROUP
from tessera.controller.runtime import DEFAULT_HANDOVER_GRACE, Controller
from tessera.dra.slices import MANAGED_BY, MANAGED_BY_LABEL
from tessera.kube.client import make_api_client
from tessera.kube.objects import CLAIMS, LAYOUTS, POLICIES, SLICES, Api

registry = kopf.OperatorRegistry()


def _controller(memo: Any) -> Controller:
    controller: Controller = memo.controller
    return controller


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    if os.environ.get("KUBECONFIG"):
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs)


@kopf.on.startup(registry=registry)
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{API_GROUP}/operator"
    settings.posting.level = logging.WARNING  # our own events say what matters
    settings.peering.standalone = True  # one active replica (Deployment strategy Recreate)
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = [1, 2, 5, 10]
    api_client = await make_api_client(os.environ.get("KUBECONFIG"))
    grace = float(os.environ.get("TESSERA_HANDOVER_GRACE", DEFAULT_HANDOVER_GRACE))
    # Tests only: delay every ResourceClaim event, to prove the handover does not rely on the watch.
    memo.claim_watch_delay = float(os.environ.get("TESSERA_FAULT_CLAIM_WATCH_DELAY", "0"))
    controller = Controller(Api(api_client), handover_grace=grace)
    memo.controller = controller
    memo.api_client = api_client
    await controller.start()


@kopf.on.cleanup(registry=registry)
async def cleanup(memo: Any, **_: Any) -> None:
    if getattr(memo, "controller", None) is not None:
        await _controller(memo).stop()
        await memo.api_client.close()


# -- SharingPolicies ---------------------------------------------------------------------


@kopf.on.resume(*POLICIES, registry=registry)
@kopf.on.create(*POLICIES, registry=registry)
@kopf.on.update(*POLICIES, registry=registry)
async def policy_changed(body: kopf.Body, memo: Any, **_: Any) -> None:
    _controller(memo).policy_seen(dict(body))


@kopf.on.delete(*POLICIES, registry=registry)
async def policy_deleted(name: str, memo: Any, **_: Any) -> None:
    _controller(memo).policy_deleted(name)


# -- Nodes, NodeLayouts, ResourceClaims ----------------------------------------------------


@kopf.on.event("", "v1", "nodes", registry=registry)
async def node_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    _controller(memo).node_seen(str(event["type"]), event["object"])


@kopf.on.event(*LAYOUTS, registry=registry)
async def layout_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    _controller(memo).layout_seen(str(event["type"]), event["object"])


@kopf.on.event(*CLAIMS, registry=registry)
async def claim_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    if memo.claim_watch_delay:  # fault injection: a watch that lags behind the scheduler
        await asyncio.sleep(memo.claim_watch_delay)
    _controller(memo).claim_seen(str(event["type"]), event["object"])


@kopf.on.event(*SLICES, labels={MANAGED_BY_LABEL: MANAGED_BY}, registry=registry)
async def slice_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    _controller(memo).slice_seen(str(event["type"]), dict(event["object"]))
