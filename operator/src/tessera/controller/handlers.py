"""Kopf handlers: thin adapters from watch events to the :class:`Controller`.

SharingPolicies and ResourceClaims get plain Kopf event handlers, which store nothing on the
objects: Kopf writes nothing at all (no finalizers, annotations or events), so that every write
goes through the fenced client of the replica that holds the lease
(``tessera.controller.leadership`` says how the two replicas, Kopf and the fence combine). The high-volume
kinds — Nodes, NodeLayouts (large) and our ResourceSlices — skip Kopf, and so do the agents'
fence claims (a label selector on Kopf's claim watch): the Controller's own
``tessera.kube.watch`` loops hand each event on as the API sent it, with no per-event deep
copy or per-object bookkeeping. The startup handler holds the settings, starts the Controller
(warm, as a standby) and the leader election; cleanup hands the lease over and stops both.
Not for: logic (``decide``, ``policystatus``) or API writes (``runtime``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from tessera import API_GROUP, gctuning
from tessera.controller.leadership import Leadership, LeaseSettings
from tessera.controller.nics import NicPublisher
from tessera.controller.runtime import DEFAULT_HANDOVER_GRACE, DEFAULT_WORKERS, Controller
from tessera.controller.stallwatch import StallWatch
from tessera.kube.claims import NOT_FENCE_CLAIMS
from tessera.kube.http import RETRY_BACKOFF
from tessera.kube.lease import LeaseTiming
from tessera.kube.objects import CLAIMS, POLICIES, Api
from tessera.kube.watch import idle_timeout_from_environment

registry = kopf.OperatorRegistry()


class EventsOnlyDiffBase(kopf.DiffBaseStorage):
    """Kopf's diff base for an operator of event handlers only: nothing is compared, so nothing
    is built, read or stored.

    On every event, before any handler, Kopf reads the object's stored diff base and builds a
    new one (a deep copy of the whole body, status included), then diffs the two, to tell
    on.create/on.update/on.field handlers what changed. This operator registers none
    (``kopf.on.event`` only: the Controller judges what changed; ``tests/test_handlers.py``
    keeps it so), and every claim event paid for the copy, each agent's claim-check ask and
    the operator's answer among them: ``benchmarks/bench_kopf_events.py`` measures it."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return kopf.BodyEssence()  # the same empty essence: no change to tell

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None  # Kopf stores a diff base after on.create/on.update handlers only: none here


def _controller(memo: Any) -> Controller:
    controller: Controller = memo.controller
    return controller


def _leadership(memo: Any) -> Leadership:
    """This replica's lease elector and fenced client, made once (Kopf may ask for its login
    before or after startup): Kopf's login and the Controller share the client's credentials."""
    if getattr(memo, "leadership", None) is None:
        env = os.environ.get
        defaults = LeaseTiming()
        timing = LeaseTiming(float(env("TESSERA_LEASE_DURATION", str(defaults.lease_duration))),
                             float(env("TESSERA_RENEW_DEADLINE", str(defaults.renew_deadline))),
                             float(env("TESSERA_RETRY_PERIOD", str(defaults.retry_period))))
        memo.leadership = Leadership(LeaseSettings(env("TESSERA_LEASE_NAMESPACE", "tessera-system"),
                                                   env("TESSERA_LEASE_NAME", "tessera-operator"),
                                                   env("TESSERA_LEADER_IDENTITY", ""), timing,
                                                   env("TESSERA_FAULT_WRITE_LOG", "")), env("KUBECONFIG"))
    leadership: Leadership = memo.leadership
    return leadership


@kopf.on.login(registry=registry)
async def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    """Kopf connects with the credentials Tessera's client has (one kubeconfig path, one
    parser, exec plugins included). Kopf asks again when its token expired or was refused, so
    the token is fetched afresh: the exec plugin runs again, a token file is read again."""
    client = _leadership(memo).client
    await client.refresh_credentials(force=True)
    token = await client.bearer_token()
    c = client.credentials
    return kopf.ConnectionInfo(
        server=c.server, ca_path=c.ca_file, ca_data=c.ca_data, insecure=c.insecure or None,
        certificate_path=c.cert_file, private_key_path=c.key_file,
        certificate_data=c.cert_data, private_key_data=c.key_data,
        token=token, expiration=client.token_expires_at,
    )


def configure(settings: kopf.OperatorSettings) -> None:
    """Kopf's settings for this operator (its startup handler applies them)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = EventsOnlyDiffBase()
    # Event handlers need no finalizer; Kopf removes its own from objects that no handler needs it
    # on, so it is given one that no object carries (the older f"{API_GROUP}/operator" is lifted
    # by the leader: Controller.policy_seen).
    settings.persistence.finalizer = f"{API_GROUP}/kopf-never-set"
    settings.posting.enabled = False  # our own events say what matters, and only the leader posts them
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True  # Kopf's peering is not leader election: the Lease decides
    # Kopf's watches get the ListWatch's idle bound (tessera.kube.watch says why 90 s): a watch
    # that hears not even a bookmark for that long is reopened, not left half-open until the
    # client timeout (330 s: the server's 300 s and 30 s for it to say so) runs out. Connecting
    # may take 30 s at most, as for the ListWatch.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.watching.inactivity_timeout = idle_timeout_from_environment()
    # The agents' fence claims (one a node) hold nothing, and each claim check writes one twice
    # (the ask and the answer): the apiserver leaves them out of Kopf's claim watch and lists,
    # so Kopf never parses or queues them. ``ClaimChecks`` watches every claim, fences included.
    settings.watching.label_selectors[CLAIMS[0], CLAIMS[2]] = NOT_FENCE_CLAIMS
    settings.networking.error_backoffs = list(RETRY_BACKOFF)  # Tessera's one retry schedule


@kopf.on.startup(registry=registry)
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    configure(settings)
    memo.stallwatch = StallWatch()  # says when and where the loop (and so the Lease) is held up
    memo.stallwatch.start()
    leadership = _leadership(memo)
    ready_port = int(os.environ.get("TESSERA_READY_PORT", "0"))
    grace = float(os.environ.get("TESSERA_HANDOVER_GRACE", DEFAULT_HANDOVER_GRACE))
    workers = int(os.environ.get("TESSERA_WORKERS", DEFAULT_WORKERS))
    controller = Controller(Api(leadership.client), workers=workers, handover_grace=grace, leading=False)
    memo.controller = controller
    leadership.start(controller)
    if ready_port:
        await leadership.serve_readiness(ready_port)
    memo.nics = NicPublisher(Api(leadership.client))  # the NIC family's room: tessera.controller.nics
    controller.share_watches(memo.nics.node_seen, memo.nics.layout_seen)  # one watch each, for both rooms
    await controller.start()
    await memo.nics.start(watch_nodes=False)
    gctuning.freeze()  # the view the start's lists built is long-lived: later full collections skip it


@kopf.on.cleanup(registry=registry)
async def cleanup(memo: Any, **_: Any) -> None:
    if getattr(memo, "leadership", None) is not None:
        memo.leadership.fence.shut()  # nothing more from this replica, then the lease goes
    if getattr(memo, "nics", None) is not None:
        await memo.nics.stop()
    if getattr(memo, "controller", None) is not None:
        await _controller(memo).stop()
    if getattr(memo, "leadership", None) is not None:
        await memo.leadership.stop()
    if getattr(memo, "stallwatch", None) is not None:
        await memo.stallwatch.stop()


# -- SharingPolicies ---------------------------------------------------------------------


@kopf.on.event(*POLICIES, registry=registry)
async def policy_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    body = event["object"]
    if event["type"] == "DELETED":
        _controller(memo).policy_deleted(str(body["metadata"]["name"]))
    else:
        _controller(memo).policy_seen(body)


# -- ResourceClaims ------------------------------------------------------------------------


@kopf.on.event(*CLAIMS, registry=registry)
async def claim_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    _controller(memo).claim_seen(str(event["type"]), event["object"])
