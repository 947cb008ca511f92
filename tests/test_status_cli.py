"""``tessera status`` / ``kubectl tessera status`` without a cluster: per node and GPU the layout,
the published devices and the claim (namespace/name) holding each; and the kubectl plugin's
entry point, which offers ``plan`` and ``status`` only."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from tessera.cli.kubectl import PLUGIN_COMMANDS
from tessera.cli.kubectl import main as kubectl_main
from tessera.cli.status import ClusterView, holders, render_status

ROOT = Path(__file__).resolve().parents[1]


def _layout(node: str, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": node}, "status": {"gpus": gpus}}


def _device(name: str, kind: str, memory: str, shared: bool = False, taints: bool = False) -> dict[str, Any]:
    device: dict[str, Any] = {"name": name, "attributes": {"type": {"string": kind}},
                              "capacity": {"memory": {"value": memory}}}
    if shared:
        device["allowMultipleAllocations"] = True
    if taints:
        device["taints"] = [{"key": "tessera.dev/repartition", "effect": "NoSchedule"}]
    return device


def _slice(node: str, devices: list[dict[str, Any]], driver: str = "gpu.tessera.dev") -> dict[str, Any]:
    return {"spec": {"driver": driver, "pool": {"name": node}, "nodeName": node, "devices": devices}}


def _claim(namespace: str, name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name},
            "status": {"allocation": {"devices": {"results": results}}}}


VIEW = ClusterView(
    layouts=[
        _layout("node-b", []),
        _layout("node-a", [
            {"index": 1, "productName": "NVIDIA H100 80GB HBM3", "memoryMib": 81559, "strategy": "Exclusive",
             "policy": None},
            {"index": 0, "productName": "NVIDIA H100 80GB HBM3", "memoryMib": 81559, "strategy": "MIG",
             "policy": "inference", "migInstances": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb",
                                                                                          "start": 4}]},
        ]),
    ],
    slices=[
        _slice("node-a", [_device("gpu-0-mig-3g-40gb-0", "mig", "40448Mi"),
                          _device("gpu-0-mig-3g-40gb-4", "share", "40448Mi", shared=True),
                          _device("gpu-1", "gpu", "81559Mi", taints=True),
                          _device("gpu-1-dyn-1g-10gb-0", "mig", "9984Mi")]),
        _slice("node-a", [_device("gpu-0", "gpu", "1Gi")], driver="other.example.com"),
    ],
    claims=[
        _claim("team-a", "vllm-gpu-x7", [{"driver": "gpu.tessera.dev", "pool": "node-a",
                                          "device": "gpu-0-mig-3g-40gb-0"}]),
        _claim("team-b", "notebook-gpu", [{"driver": "gpu.tessera.dev", "pool": "node-a",
                                           "device": "gpu-0-mig-3g-40gb-4",
                                           "consumedCapacity": {"memory": "10Gi", "compute": "25"}}]),
        _claim("team-c", "nic", [{"driver": "other.example.com", "pool": "node-a", "device": "gpu-0"}]),
        {"metadata": {"namespace": "team-d", "name": "pending"}, "status": {}},
    ],
)


def test_status_shows_each_gpu_its_layout_devices_and_the_claim_holding_each() -> None:
    text = render_status(VIEW)
    lines = text.splitlines()
    assert lines[0] == "node node-a"
    assert lines[1].startswith("  GPU 0  NVIDIA H100 80GB HBM3  80GiB  strategy MIG  policy inference")
    assert lines[2] == "      MIG instances: 3g.40gb@0  3g.40gb@4"
    assert "gpu-0-mig-3g-40gb-0" in lines[3]
    assert lines[3].endswith("<- team-a/vllm-gpu-x7")
    assert "share shared" in lines[4]
    assert lines[4].endswith("<- team-b/notebook-gpu (compute 25%, memory 10Gi)")
    assert "39.5Gi" in lines[3]
    assert "policy (none: unmanaged)" in lines[5]
    assert "gpu tainted" in lines[6]
    assert lines[6].endswith("free")
    assert lines[7] == "      + 1 DynamicMIG placements published (made when a claim needs one)"
    assert lines[8] == "node node-b  (no GPUs reported yet: is the agent running there?)"
    assert "team-c" not in text, "another driver's devices and claims are not Tessera's"


def test_status_of_named_nodes_only_and_of_an_empty_cluster() -> None:
    assert "node-a" not in render_status(VIEW, ["node-b"])
    assert render_status(ClusterView([], [], []), ["x"]) == "no NodeLayouts for x: no Tessera agent has reported yet"
    assert holders(VIEW.claims) == {
        ("node-a", "gpu-0-mig-3g-40gb-0"): ["team-a/vllm-gpu-x7"],
        ("node-a", "gpu-0-mig-3g-40gb-4"): ["team-b/notebook-gpu (compute 25%, memory 10Gi)"],
    }


def test_the_kubectl_plugin_is_an_entry_point_named_as_kubectl_looks_for_it() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-tessera"] == "tessera.cli.kubectl:main"
    assert PLUGIN_COMMANDS == ("plan", "status")


def test_the_kubectl_plugin_offers_plan_and_status_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        kubectl_main(["operator"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "kubectl tessera" in err
    assert "invalid choice: 'operator'" in err
    with pytest.raises(SystemExit):
        kubectl_main(["status", "--help"])
    assert "usage: kubectl tessera status" in capsys.readouterr().out
