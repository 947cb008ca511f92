"""Builders for the workload objects the demo and the integration tests create: a
ResourceClaimTemplate with one device request, and a Pod that uses it. Plain dicts, the way
``kubectl apply`` takes them. Not for: anything Tessera itself writes.
"""

from __future__ import annotations

from typing import Any

from tessera import RESOURCE_API_VERSION

NO_IMAGE = "registry.invalid/none:0"  # nothing pulls it: there is no kubelet on the local cluster
# What a container on a real node runs to show what it got: the device variables, one line
# per /dev/nvidia* node, then "ready" (and it keeps running for as long as ``hold`` says).
SHOW_DEVICES = (
    "env | grep -E '^(NVIDIA|CUDA)_' | sort; "
    "for f in /dev/nvidia*; do [ -e \"$f\" ] && echo \"device $f\"; done; echo ready"
)


def show_devices_args(hold_seconds: int = 0) -> list[str]:
    """``args`` for a busybox container that prints what it got, then sleeps ``hold_seconds``."""
    script = SHOW_DEVICES + (f"; exec sleep {hold_seconds}" if hold_seconds else "")
    return ["sh", "-c", script]


def claim_template(
    name: str,
    namespace: str,
    device_class: str,
    cel: str | None = None,
    capacity: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A template for claims of one device of ``device_class``, optionally narrowed by a CEL
    selector and asking for consumable ``capacity`` (e.g. ``{"memory": "10Gi"}``)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def pod_with_claim(
    name: str,
    namespace: str,
    template: str,
    node_selector: dict[str, str] | None = None,
    image: str = NO_IMAGE,
    args: list[str] | None = None,
    labels: dict[str, str] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    """A Pod whose one container uses a claim made from ``template``."""
    container: dict[str, Any] = {"name": "main", "image": image, "resources": {"claims": [{"name": "gpu"}]}}
    if not image.endswith(":latest"):
        container["imagePullPolicy"] = "IfNotPresent"  # local images: there is no registry to ask
    if args:
        container["args"] = args
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "containers": [container],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    spec["terminationGracePeriodSeconds"] = 2
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def on_node(node: str) -> dict[str, str]:
    """A node selector for exactly one node."""
    return {"kubernetes.io/hostname": node}
