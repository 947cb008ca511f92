"""The apiserver refuses every invalid SharingPolicy of the shared table with a readable
message, and accepts the valid ones: the generated CRDs (schema and CEL rules) installed into
the real local control plane. The unit tests hold the pydantic models to the same table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.policy_cases import INVALID, VALID, InvalidPolicy, policy_object

pytestmark = pytest.mark.integration

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


@pytest.fixture(scope="module")
def crds_installed(cluster: Any) -> Any:
    cluster.kubectl("apply", "-f", str(CRD_DIR))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/sharingpolicies.tessera.dev",
        "crd/nodelayouts.tessera.dev",
    )
    return cluster


def _apply(cluster: Any, obj: dict[str, Any]) -> Any:
    """``kubectl apply`` as a person runs it (strict field validation is kubectl's default)."""
    return cluster.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_apiserver_refuses_with_a_readable_message(crds_installed: Any, case: InvalidPolicy) -> None:
    result = _apply(crds_installed, policy_object(f"bad-{case.id}", case.spec))
    assert result.returncode != 0, f"{case.id} was accepted"
    assert case.apiserver_message in result.stderr
    assert case.field in result.stderr
    # One clear complaint, not a cascade of cryptic follow-ups from other rules.
    assert "evaluating rule" not in result.stderr
    assert "no such key" not in result.stderr


@pytest.mark.parametrize(("name", "spec"), VALID, ids=[name for name, _ in VALID])
def test_apiserver_accepts_and_defaults(crds_installed: Any, name: str, spec: dict[str, Any]) -> None:
    result = _apply(crds_installed, policy_object(f"ok-{name}", spec))
    assert result.returncode == 0, result.stderr
    stored = json.loads(crds_installed.kubectl("get", "sharingpolicy", f"ok-{name}", "-o", "json").stdout)
    assert stored["spec"]["strategy"] == spec.get("strategy", "Exclusive")
    assert stored["spec"]["priority"] == spec.get("priority", 0)


def test_examples_are_accepted_and_listed_by_short_name(crds_installed: Any) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples" / "policies"
    crds_installed.kubectl("apply", "-f", str(examples))
    listing = crds_installed.kubectl("get", "sp").stdout
    assert listing.split()[:7] == ["NAME", "STRATEGY", "READY", "NODES", "GPUS", "AGE", "adaptive-inference"]
    assert "h100-inference" in listing
