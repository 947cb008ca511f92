"""The README's first command works: ``tessera demo --exit`` starts its own control plane,
runs the operator and three simulated nodes, and shows every workload placed (one after an
adaptive recut of an idle GPU for it) — on real nodes
(kubelet + containerd) with what each container printed where the machine allows them, and
otherwise (or with ``--no-real-nodes``) prepared by the demo playing the kubelet's part."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tessera.localcluster.nodes import real_nodes_possible

pytestmark = pytest.mark.integration


def demo(*extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "tessera", "demo", "--exit", "--timeout", "180", *extra],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def assert_placed(out: str) -> None:
    assert "gpu-0-mig-3g-40gb-4          share shared    39.5Gi  <- vllm-0 (compute 50%, memory 20Gi)" in out
    assert "<- llama-70b-0" in out
    assert out.count("(compute 10%, memory 10Gi)") == 3, "three notebooks share the A100 through MPS"
    assert "MIG instances: 3g.71gb@4" in out, "made at prepare time, where it fragments least"
    # The adaptive policy: slice-0 waited for a 3g slice nothing published, and GPU 2 was recut.
    assert re.search(r"^Recut for a waiting Pod: slice-0-gpu-\S+: GPU 2 on demo-h100 is being recut to layout "
                     r"'halves' of SharingPolicy inference-adaptive for this claim$", out, re.M), out
    assert re.search(r"^      adaptive layout: halves \(recut for claim tessera-demo/slice-0-gpu-\S+\)$", out, re.M)
    assert re.search(r"^      gpu-2-mig-3g-40gb-[04] +mig +39\.5Gi  <- slice-0$", out, re.M)


def test_demo_without_real_nodes_places_and_prepares_every_workload() -> None:
    out = demo("--no-real-nodes")
    assert "No real nodes (--no-real-nodes): the demo plays the kubelet's part, no container starts." in out
    assert_placed(out)
    cdi = [line.split() for line in out.splitlines() if "k8s.gpu.tessera.dev/claim=" in line]
    assert sorted(parts[0] for parts in cdi) == [
        "llama-70b-0",
        "notebook-0",
        "notebook-1",
        "notebook-2",
        "slice-0",
        "trainer-0",
        "vllm-0",
    ]
    assert all("error" not in " ".join(parts) for parts in cdi)
    assert "No shared NIC in this run: it needs real nodes" in out


def test_demo_on_real_nodes_shows_what_each_container_printed() -> None:
    why_not = real_nodes_possible()
    if why_not and os.environ.get("TESSERA_REQUIRE_REAL_NODES") != "1":
        pytest.skip(f"no real nodes on this machine: {why_not}")
    out = demo()
    assert "No real nodes" not in out
    assert_placed(out)
    printed = out.split("What each container printed (kubectl logs)")[1]
    rows = dict(re.findall(r"^  (\S+-\d)\s+(.*)$", printed, re.M))
    assert sorted(rows) == ["llama-70b-0", "notebook-0", "notebook-1", "notebook-2", "slice-0", "trainer-0", "vllm-0"]
    assert re.fullmatch(r"NVIDIA_VISIBLE_DEVICES=MIG-[0-9a-f-]+", rows["slice-0"])
    assert re.fullmatch(r"NVIDIA_VISIBLE_DEVICES=GPU-[0-9a-f-]+", rows["llama-70b-0"])
    assert re.fullmatch(r"NVIDIA_VISIBLE_DEVICES=MIG-[0-9a-f-]+", rows["trainer-0"])
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in rows["vllm-0"]
    assert re.search(r"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=MIG-[0-9a-f-]+=20480M", rows["vllm-0"])
    for notebook in ("notebook-0", "notebook-1", "notebook-2"):
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10" in rows[notebook]
        assert re.search(r"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-[0-9a-f-]+=10240M", rows[notebook])
    devices = re.findall(r"^\s+/dev: (.*)$", printed, re.M)
    assert len(devices) == 7
    assert all({"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} <= set(d.split()) for d in devices)
    assert "nvidia1" in devices[0].split(), "llama-70b-0 holds the second H100 whole"
    # The shared NIC: each share, the Pod holding it, its net1 and what that Pod measured.
    assert re.search(r"^Shared NIC on demo-h100: device nic-td[0-9a-f]{6} .*NetworkSharingPolicy demo-uplink, 1G sold",
                     out, re.M)
    shares = re.findall(r"^  share (\S+) +<- (\S+)  net1 (10\.96\.0\.\d+/24)  measured (\d+\.\d+) Gbit/s, "
                        r"(\d+\.\d)% of its share$", out, re.M)
    assert [(rate, pod) for rate, pod, *_ in shares] == [("200M", "upload-0"), ("500M", "upload-1")], out
    assert len({address for _, _, address, *_ in shares}) == 2, "each share has an address of its own"
    assert all(float(measured) > 0 for *_, measured, _ in shares), "both Pods' traffic crossed the uplink"
