"""The pydantic models refuse the shared table of invalid SharingPolicies with the same words
the apiserver's CEL rules use (the integration test holds the apiserver to the same table),
and accept the valid ones."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tessera.cli.plan import readable_errors
from tessera.models.crd import sharing_policy_crd
from tessera.models.policy import SharingPolicy
from tests.policy_cases import INVALID, VALID, InvalidPolicy, policy_object


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_pydantic_refuses_with_a_readable_message(case: InvalidPolicy) -> None:
    with pytest.raises(ValidationError) as caught:
        SharingPolicy.model_validate(policy_object(case.id, case.spec))
    lines = readable_errors(caught.value)
    assert any(line.startswith(f"{case.field}: ") and case.message in line for line in lines), lines


@pytest.mark.parametrize(("name", "spec"), VALID, ids=[name for name, _ in VALID])
def test_pydantic_accepts(name: str, spec: dict[str, Any]) -> None:
    policy = SharingPolicy.model_validate(policy_object(name, spec))
    assert policy.name == name
    assert SharingPolicy.model_validate(policy.to_kube()) == policy


def test_every_cross_field_rule_in_the_schema_has_a_case() -> None:
    messages: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            messages.extend(rule["message"] for rule in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(sharing_policy_crd())
    covered = {case.apiserver_message for case in INVALID}
    missing = [m for m in messages if not any(c in m for c in covered)]
    assert messages
    assert not missing
