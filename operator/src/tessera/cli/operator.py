"""``tessera operator``: run the Kopf operator (policies → NodeLayouts → ResourceSlices).

Logging is configured once here; the liveness probe is Kopf's endpoint, readiness (leader or
standby) is ``tessera.controller.leadership``'s ``/readyz``, and metrics are served by
prometheus_client. Flags have ``TESSERA_*`` environment equivalents.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from typing import TypeVar

import kopf
from prometheus_client import start_http_server

from tessera import gctuning
from tessera.controller.runtime import DEFAULT_HANDOVER_GRACE, DEFAULT_WORKERS
from tessera.kube.lease import LeaseTiming
from tessera.kube.watch import idle_timeout_from_environment
from tessera.log import configure_logging

N = TypeVar("N", int, float)


def _within(kind: Callable[[str], N], what: str, low: N, high: N) -> Callable[[str], N]:
    """An argparse type: ``kind`` of ``text``, refused with a clear message outside low..high."""
    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {what}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} {what} is out of range: give {low} to {high}")
        return value
    return parse


_seconds = _within(float, "seconds", 0.0, 60.0)
_lease_seconds = _within(float, "seconds", 0.1, 300.0)
_workers = _within(int, "workers", 1, 256)
DEFAULTS = LeaseTiming()  # client-go's lease timing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--kubeconfig", default=env("KUBECONFIG"), help="default: $KUBECONFIG, else in-cluster")
    parser.add_argument("--health-port", type=int, default=int(env("TESSERA_HEALTH_PORT", "8080")),
                        help="liveness probe at /healthz (0: off)")
    parser.add_argument("--metrics-port", type=int, default=int(env("TESSERA_METRICS_PORT", "9090")),
                        help="Prometheus metrics at /metrics (0: off)")
    parser.add_argument("--handover-grace", type=_seconds,
                        default=_seconds(env("TESSERA_HANDOVER_GRACE", str(DEFAULT_HANDOVER_GRACE))),
                        help="seconds between tainting devices that will change and re-reading the claims "
                        f"(scheduling cycles under way finish first); default {DEFAULT_HANDOVER_GRACE:g}")
    parser.add_argument("--workers", type=_workers, default=_workers(env("TESSERA_WORKERS", str(DEFAULT_WORKERS))),
                        help=f"nodes reconciled at once (a reconcile mostly waits on the API); "
                        f"default {DEFAULT_WORKERS}")
    parser.add_argument("--ready-port", type=int, default=int(env("TESSERA_READY_PORT", "8081")),
                        help="readiness probe at /readyz: 200 'leader' or 'standby' once the view is read (0: off)")
    lease = parser.add_argument_group("leader election (a coordination.k8s.io Lease; client-go's defaults)")
    lease.add_argument("--lease-namespace",
                       default=env("TESSERA_LEASE_NAMESPACE", env("POD_NAMESPACE", "tessera-system")))
    lease.add_argument("--lease-name", default=env("TESSERA_LEASE_NAME", "tessera-operator"))
    lease.add_argument("--leader-identity", default=env("TESSERA_LEADER_IDENTITY", ""),
                       help="default: $POD_NAME (else the host name) and a random suffix")
    lease.add_argument("--lease-duration", type=_lease_seconds,
                       default=_lease_seconds(env("TESSERA_LEASE_DURATION", str(DEFAULTS.lease_duration))),
                       help="seconds a standby waits after the lease last changed before it takes it; "
                       f"default {DEFAULTS.lease_duration:g}")
    lease.add_argument("--renew-deadline", type=_lease_seconds,
                       default=_lease_seconds(env("TESSERA_RENEW_DEADLINE", str(DEFAULTS.renew_deadline))),
                       help="seconds after its last renewal that a leader stops writing; "
                       f"default {DEFAULTS.renew_deadline:g}")
    lease.add_argument("--retry-period", type=_lease_seconds,
                       default=_lease_seconds(env("TESSERA_RETRY_PERIOD", str(DEFAULTS.retry_period))),
                       help="seconds between renewals (and a candidate's tries); "
                       f"default {DEFAULTS.retry_period:g}")
    parser.add_argument("--log-level", default=env("TESSERA_LOG_LEVEL", "info"))
    parser.add_argument("--log-json", action="store_true", default=env("TESSERA_LOG_JSON") == "1",
                        help="JSON logs even on a terminal")


def run(args: argparse.Namespace) -> int:
    try:
        LeaseTiming(args.lease_duration, args.renew_deadline, args.retry_period)
    except ValueError as exc:
        raise SystemExit(f"tessera operator: --lease-duration, --renew-deadline, --retry-period: {exc}") from None
    try:
        idle_timeout_from_environment()  # read again by each watch: a bad value stops the operator here
    except ValueError as exc:
        raise SystemExit(f"tessera operator: {exc}") from None
    configure_logging(args.log_level, json=True if args.log_json else None)
    gctuning.tune()
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    os.environ["TESSERA_HANDOVER_GRACE"] = str(args.handover_grace)  # read by the startup handler
    os.environ["TESSERA_WORKERS"] = str(args.workers)
    os.environ["TESSERA_READY_PORT"] = str(args.ready_port)
    os.environ.update(TESSERA_LEASE_NAMESPACE=args.lease_namespace, TESSERA_LEASE_NAME=args.lease_name,
                      TESSERA_LEADER_IDENTITY=args.leader_identity, TESSERA_LEASE_DURATION=str(args.lease_duration),
                      TESSERA_RENEW_DEADLINE=str(args.renew_deadline), TESSERA_RETRY_PERIOD=str(args.retry_period))
    if args.metrics_port:
        start_http_server(args.metrics_port, addr="0.0.0.0")  # scraped from the pod network
    from tessera.controller.handlers import registry  # imports kopf handlers only when running

    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    asyncio.run(
        kopf.operator(registry=registry, clusterwide=True, standalone=True, liveness_endpoint=liveness)
    )
    return 0
