"""The README's first command works: ``tessera demo --exit`` starts its own control plane,
runs the operator and three simulated nodes, and shows every workload placed and prepared."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_demo_places_and_prepares_every_workload() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tessera", "demo", "--exit", "--timeout", "120"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "gpu-0-mig-3g-40gb-4          share shared    39.5Gi  <- vllm-0 (compute 50%, memory 20Gi)" in out
    assert "<- llama-70b-0" in out
    assert out.count("(compute 10%, memory 10Gi)") == 3, "three notebooks share the A100 through MPS"
    assert "MIG instances: 3g.71gb@0" in out, "the DynamicMIG instance is made at prepare time"
    cdi = [line.split() for line in out.splitlines() if "k8s.gpu.tessera.dev/claim=" in line]
    assert sorted(parts[0] for parts in cdi) == [
        "llama-70b-0",
        "notebook-0",
        "notebook-1",
        "notebook-2",
        "trainer-0",
        "vllm-0",
    ]
    assert all("error" not in " ".join(parts) for parts in cdi)
