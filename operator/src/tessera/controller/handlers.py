"""Kopf handlers: thin adapters from watch events to the :class:`Controller`.

SharingPolicies get Kopf create/update/resume/delete handlers (Kopf keeps its small bookkeeping
in ``tessera.dev/`` annotations, never in our structural status); ResourceClaims a plain Kopf
event handler, which stores nothing on them (claims are not ours to annotate). The high-volume
kinds — Nodes, NodeLayouts (large) and our ResourceSlices — skip Kopf: the Controller's own
``tessera.kube.watch`` loops hand each event on as the API sent it, with no per-event deep
copy or per-object bookkeeping. The startup handler holds the settings and starts the
Controller; cleanup stops it.
Not for: logic (``decide``, ``policystatus``) or API writes (``runtime``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from tessera import API_GROUP
from tessera.controller.nics import NicPublisher
from tessera.controller.runtime import DEFAULT_HANDOVER_GRACE, DEFAULT_WORKERS, Controller
from tessera.kube.http import KubeClient
from tessera.kube.objects import CLAIMS, POLICIES, Api

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
    client = KubeClient.from_environment(os.environ.get("KUBECONFIG"))
    memo.client = client
    grace = float(os.environ.get("TESSERA_HANDOVER_GRACE", DEFAULT_HANDOVER_GRACE))
    # Tests only: delay every ResourceClaim event, to prove the handover does not rely on the watch.
    memo.claim_watch_delay = float(os.environ.get("TESSERA_FAULT_CLAIM_WATCH_DELAY", "0"))
    workers = int(os.environ.get("TESSERA_WORKERS", DEFAULT_WORKERS))
    controller = Controller(Api(client), workers=workers, handover_grace=grace)
    memo.controller = controller
    await controller.start()
    memo.nics = NicPublisher(Api(client))  # the NIC family's room: tessera.controller.nics
    await memo.nics.start()


@kopf.on.cleanup(registry=registry)
async def cleanup(memo: Any, **_: Any) -> None:
    if getattr(memo, "nics", None) is not None:
        await memo.nics.stop()
    if getattr(memo, "controller", None) is not None:
        await _controller(memo).stop()
    if getattr(memo, "client", None) is not None:
        await memo.client.close()


# -- SharingPolicies ---------------------------------------------------------------------


@kopf.on.resume(*POLICIES, registry=registry)
@kopf.on.create(*POLICIES, registry=registry)
@kopf.on.update(*POLICIES, registry=registry)
async def policy_changed(body: kopf.Body, memo: Any, **_: Any) -> None:
    _controller(memo).policy_seen(dict(body))


@kopf.on.delete(*POLICIES, registry=registry)
async def policy_deleted(name: str, memo: Any, **_: Any) -> None:
    _controller(memo).policy_deleted(name)


# -- ResourceClaims ------------------------------------------------------------------------


@kopf.on.event(*CLAIMS, registry=registry)
async def claim_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    if memo.claim_watch_delay:  # fault injection: a watch that lags behind the scheduler
        await asyncio.sleep(memo.claim_watch_delay)
    _controller(memo).claim_seen(str(event["type"]), event["object"])
