"""NodeLayout.status from inventory and plans: the layout in force, and honest conditions."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.agent.backends.base import Inventory
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.reconciler import apply_layout
from tessera.agent.status import build_status
from tessera.cli.agent import add_arguments, make_backend
from tessera.models.conditions import find_condition
from tessera.models.layout import GpuLayout, Health, NodeLayoutSpec, NodeLayoutStatus, PlacedInstance
from tessera.models.policy import Strategy


def _status(backend: SimulatedBackend, spec: NodeLayoutSpec) -> NodeLayoutStatus:
    result = apply_layout(backend, spec)
    return build_status(
        result.inventory, spec, result.plans, backend="simulated", agent_version="t", observed_generation=3,
        now="2026-01-01T00:00:00Z",
    )


def _mig(uuid: str, *placed: tuple[str, int]) -> GpuLayout:
    return GpuLayout(
        uuid=uuid, strategy=Strategy.MIG, mig_instances=[PlacedInstance(profile=p, start=s) for p, s in placed]
    )


def test_an_applied_layout_is_ready_and_lists_what_exists() -> None:
    backend = SimulatedBackend.from_spec("n", "2xH100-80GB")
    uuid = backend.inventory().gpus[0].uuid
    status = _status(backend, NodeLayoutSpec(gpus=[_mig(uuid, ("3g.40gb", 0), ("3g.40gb", 4))]))
    ready = find_condition(status.conditions, "Ready")
    assert ready is not None
    assert (ready.status, ready.reason, ready.observed_generation) == ("True", "Applied", 3)
    assert [c.type for c in status.conditions] == ["Degraded", "Progressing", "Ready"]
    g0, g1 = status.gpus
    assert (g0.strategy, g0.applied, g0.model, g0.driver_version) == (Strategy.MIG, True, "H100-80GB", "580.95.05")
    assert [(i.profile, i.start, i.size, i.memory_mib) for i in g0.mig_instances] == [
        ("3g.40gb", 0, 4, 40448), ("3g.40gb", 4, 4, 40448)]
    assert (g1.strategy, g1.applied) == (Strategy.EXCLUSIVE, True)
    assert status.to_kube()["gpus"][0]["migInstances"][0]["uuid"].startswith("MIG-")


def test_an_instance_in_use_makes_ready_false_with_the_reason() -> None:
    backend = SimulatedBackend.from_spec("n", "2xH100-80GB")
    uuid = backend.inventory().gpus[1].uuid
    apply_layout(backend, NodeLayoutSpec(gpus=[_mig(uuid, *[("1g.10gb", s) for s in range(7)])]))
    busy = next(i for i in backend.inventory().gpus[1].instances if i.start == 5)
    assert busy.uuid is not None
    backend.hold(busy.uuid, "pid:1")
    status = _status(backend, NodeLayoutSpec(gpus=[_mig(uuid, ("3g.40gb", 4))]))
    ready = find_condition(status.conditions, "Ready")
    progressing = find_condition(status.conditions, "Progressing")
    degraded = find_condition(status.conditions, "Degraded")
    assert ready is not None
    assert progressing is not None
    assert degraded is not None
    assert (ready.status, ready.reason) == ("False", "InstanceInUse")
    assert ready.message == "GPU 1: 1g.10gb at slice 5 is in use; the spec wants 3g.40gb at slice 4"
    assert (progressing.status, progressing.reason) == ("True", "InstanceInUse")
    assert (degraded.status, degraded.reason) == ("False", "AsExpected")
    g1 = status.gpus[1]
    assert not g1.applied
    assert g1.message == ready.message
    assert (g1.reason, status.gpus[0].reason) == ("InstanceInUse", ""), "the GPU says why; an applied one has none"
    assert [(i.profile, i.start, i.in_use) for i in g1.mig_instances] == [("1g.10gb", 5, True)]


def test_a_lost_gpu_degrades_the_node() -> None:
    backend = SimulatedBackend.from_spec("n", "2xH100-80GB")
    backend.hardware.lose_gpu(0)
    status = _status(backend, NodeLayoutSpec())
    degraded = find_condition(status.conditions, "Degraded")
    assert degraded is not None
    assert (degraded.status, degraded.reason) == ("True", "GpuLost")
    assert "GPU 0: GPU has fallen off the bus" in degraded.message
    assert status.gpus[0].health is Health.LOST


def test_no_driver_is_reported_in_the_conditions() -> None:
    status = build_status(
        Inventory(gpus=(), problem="NVML could not start: libnvidia-ml.so.1 is missing"),
        NodeLayoutSpec(), [], backend="nvml", agent_version="t", observed_generation=1,
    )
    ready = find_condition(status.conditions, "Ready")
    assert ready is not None
    assert (ready.status, ready.reason) == ("False", "DriverUnavailable")
    assert "libnvidia-ml.so.1" in ready.message


def test_a_resync_that_finds_nothing_new_keeps_the_transition_times() -> None:
    backend = SimulatedBackend.from_spec("n", "1xH100-80GB")
    spec = NodeLayoutSpec()
    first = _status(backend, spec)
    result = apply_layout(backend, spec)
    second = build_status(
        result.inventory, spec, result.plans, backend="simulated", agent_version="t", observed_generation=3,
        previous=first, now="2026-02-02T00:00:00Z",
    )
    assert second == first


def test_the_agent_command_reads_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_NODE_NAME", "gpu-7")
    monkeypatch.setenv("TESSERA_SIMULATE", "2xH100-80GB")
    monkeypatch.setenv("TESSERA_METRICS_PORT", "0")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert (args.node_name, args.simulate, args.metrics_port) == ("gpu-7", "2xH100-80GB", 0)
    backend = make_backend(args)
    assert backend.name == "simulated"
    assert len(backend.inventory().gpus) == 2
    with pytest.raises(ValueError, match="needs --simulate"):
        make_backend(parser.parse_args(["--backend", "simulated", "--simulate", ""]))


def test_the_agent_command_without_a_readable_kubeconfig_says_so_and_exits_2(tmp_path: Path) -> None:
    # A process of its own: the command configures logging for the whole process.
    missing = tmp_path / "missing"
    done = subprocess.run(
        [sys.executable, "-m", "tessera", "agent", "--node-name", "gpu-7", "--simulate", "1xH100-80GB",
         "--kubeconfig", str(missing), "--log-json"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "cannot read the API server's address and credentials" in done.stderr
    assert str(missing) in done.stderr
