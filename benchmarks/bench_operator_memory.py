"""Benchmark: what the operator holds per node, by structure, measured with tracemalloc.

    .venv/bin/python benchmarks/bench_operator_memory.py [--nodes 200] [--simulate 8xH100-80GB]

For N simulated nodes whose GPUs all carry the MIG ``all-balanced`` layout (the agent's own
``apply_layout`` and ``build_status`` on a ``SimulatedBackend``) that one SharingPolicy asks for
(as after ``bench_operator.py``'s rollout; ``--unmanaged`` leaves out the policy), it feeds the
operator's own structures as the watches and a reconcile would, and prints the KiB each holds
per node:

- the fleet view (``Fleet.set_node`` + ``Fleet.set_layout``: the parsed NodeLayout);
- the decision kept per node (``decide_node``, its devices dropped as the Controller does);
- the slice cache (``CachedSlice`` per published slice, as the publisher keeps it);
- the list-watches' entries (``Seen`` for the Node, the NodeLayout and every slice).

Then the largest allocation sites. It isolates what grows with the fleet, which the operator's
peak RSS in ``bench_operator.py`` mixes with the interpreter, Kopf and transient buffers. Not a
test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from dataclasses import replace
from typing import Any

from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.reconciler import apply_layout
from tessera.agent.status import build_status
from tessera.controller.decide import NodeDecision, decide_node
from tessera.controller.publisher import CachedSlice, slice_stub
from tessera.controller.state import Fleet
from tessera.dra.slices import NodeRef, build_slices_from_devices
from tessera.kube.watch import Seen, metadata_stub
from tessera.log import configure_logging
from tessera.models.layout import GpuLayout, NodeLayoutSpec, PlacedInstance
from tessera.models.policy import Strategy

ALL_BALANCED = (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4))
POLICY = {"apiVersion": "tessera.dev/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": "bench"},
          "spec": {"nodeSelector": {"matchLabels": {"pool": "inference"}}, "strategy": "MIG",
                   "mig": {"preset": "all-balanced"}}}


def node_body(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7",
                         "labels": {"kubernetes.io/hostname": name, "pool": "inference"}}}


def layout_body(name: str, simulate: str) -> dict[str, Any]:
    """A NodeLayout as the API holds it once the agent applied all-balanced on every GPU."""
    backend = SimulatedBackend.from_spec(name, simulate)
    spec = NodeLayoutSpec(gpus=[
        GpuLayout(uuid=g.uuid, strategy=Strategy.MIG, policy="bench",
                  mig_instances=[PlacedInstance(profile=p, start=s) for p, s in ALL_BALANCED])
        for g in backend.inventory().gpus
    ])
    result = apply_layout(backend, spec)
    status = build_status(result.inventory, spec, result.plans, backend="simulated", agent_version="bench",
                          observed_generation=1)
    return {"apiVersion": "tessera.dev/v1alpha1", "kind": "NodeLayout",
            "metadata": {"name": name, "uid": f"uid-layout-{name}", "resourceVersion": "8", "generation": 1},
            "spec": spec.to_kube(), "status": status.to_kube()}


def traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--simulate", default="8xH100-80GB")
    parser.add_argument("--unmanaged", action="store_true", help="no SharingPolicy: every GPU is left as it is")
    args = parser.parse_args()
    configure_logging("warning")
    n = args.nodes
    names = [f"n-{i:05d}" for i in range(n)]
    nodes = [node_body(name) for name in names]
    layouts = [layout_body(name, args.simulate) for name in names]

    tracemalloc.start(8)
    figures: dict[str, int] = {}
    start = traced()
    fleet = Fleet()
    if not args.unmanaged:
        fleet.set_policy(POLICY)
    for node, layout in zip(nodes, layouts, strict=True):
        fleet.set_node(node)
        fleet.set_layout(layout)
    figures["fleet view (Node + parsed NodeLayout)"] = traced() - start

    built: dict[str, list[dict[str, Any]]] = {}  # what is published: built once, outside the figures
    for name in names:
        decision = decide_node(fleet, name, 0.0, None)
        assert decision is not None
        built[name] = [dict(s) for s in build_slices_from_devices(NodeRef(name, f"uid-{name}"),
                                                                  decision.devices_to_publish())]
    del decision

    start = traced()
    decisions: dict[str, NodeDecision] = {}
    for name in names:
        decision = decide_node(fleet, name, 0.0, None)
        assert decision is not None
        view = fleet.nodes[name].layout
        decisions[name] = replace(decision, devices=(), published=view.status if view else None)
    del decision
    figures["decisions kept"] = traced() - start

    start = traced()
    cache: dict[str, dict[str, CachedSlice]] = {}
    for name, slices in built.items():
        cache[name] = {}
        for s in slices:
            api = {**s, "metadata": {**s["metadata"], "uid": f"uid-{s['metadata']['name']}", "resourceVersion": "9"}}
            cache[name][str(s["metadata"]["name"])] = CachedSlice.of(api, b"0123456789abcdef")
    figures["slice cache"] = traced() - start

    start = traced()
    watches: dict[str, Seen | None] = {}
    for name, node, layout in zip(names, nodes, layouts, strict=True):
        watches[f"node/{name}"] = Seen.of(node, metadata_stub)
        watches[f"layout/{name}"] = Seen.of(layout, metadata_stub)
        for s in built[name]:
            watches[f"slice/{s['metadata']['name']}"] = Seen.of({**s, "metadata": {
                **s["metadata"], "uid": "0b11d1d8-b38b-587b-9aa5-15c391aff5c9", "resourceVersion": "9"}}, slice_stub)
    figures["list-watch entries (Node, NodeLayout, slices)"] = traced() - start

    del built  # what was published is not held by the operator
    snapshot = tracemalloc.take_snapshot()
    managed = "no policy (unmanaged)" if args.unmanaged else "as a MIG policy asks"
    print(f"{n} nodes x {args.simulate}, MIG all-balanced on every GPU, {managed}: KiB held per node")
    for what, size in figures.items():
        print(f"  {what:48} {size / n / 1024:6.1f}")
    print(f"  {'total':48} {sum(figures.values()) / n / 1024:6.1f}")
    print("largest allocation sites (KiB per node):")
    for stat in snapshot.statistics("lineno")[:8]:
        frame = stat.traceback[0]
        print(f"  {stat.size / n / 1024:6.1f}  {frame.filename.rsplit('/', 3)[-1]}:{frame.lineno}")


if __name__ == "__main__":
    main()
