"""The CRDs in crds/ are generated from the models, stay in step with them, and are structural
(what the apiserver accepts); the integration test installs them into a real apiserver."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tessera.models.base import KubeModel
from tessera.models.crd import crds, main, render, stale_files
from tessera.models.layout import NodeLayoutSpec, NodeLayoutStatus

CRD_DIR = Path(__file__).resolve().parents[1] / "crds"
_GPU = {"uuid": "GPU-a", "index": 0, "productName": "NVIDIA H100 80GB HBM3", "memoryMib": 81559}
_READY = {"type": "Ready", "status": "True", "reason": "Applied", "lastTransitionTime": "2026-12-07T00:00:00Z"}


def test_crds_folder_matches_the_models() -> None:
    stale = stale_files(CRD_DIR)
    assert stale == [], f"regenerate with: python -m tessera.models.crd --write crds/ ({stale})"


def test_check_command_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--write", str(tmp_path)]) == 0
    assert main(["--check", str(tmp_path)]) == 0
    (tmp_path / "tessera.dev_nodelayouts.yaml").write_text("# edited by hand\n")
    assert main(["--check", str(tmp_path)]) == 1
    assert "tessera.dev_nodelayouts.yaml is out of date" in capsys.readouterr().out


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, value in node.items():
            out.extend(_walk(value, f"{path}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_walk(value, f"{path}[{i}]"))
    return out


@pytest.mark.parametrize("name", sorted(crds()))
def test_schema_is_structural(name: str) -> None:
    crd = crds()[name]
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert not {"$ref", "anyOf", "oneOf", "allOf", "$defs", "title", "const", "examples"} & set(node), path
        assert node.get("additionalProperties") is not False, path
        assert not isinstance(node.get("exclusiveMaximum"), int | float) or isinstance(node["exclusiveMaximum"], bool)
        if node.get("default", 0) is None:
            pytest.fail(f"null default at {path}")
        if "properties" in node and path.endswith(("properties.spec", "properties.status")):
            assert node["type"] == "object"
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["scope"] == "Cluster"
    assert yaml.safe_load(render(crd)) == crd


def test_sharing_policy_crd_names_columns_and_rules() -> None:
    crd = crds()["tessera.dev_sharingpolicies.yaml"]
    assert crd["spec"]["names"]["shortNames"] == ["sp"]
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert {"Strategy", "Ready", "Nodes", "GPUs", "Age"} <= set(columns)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    strategies = ["Exclusive", "MIG", "DynamicMIG", "TimeSlicing", "MPS", "Adaptive"]
    assert spec["properties"]["strategy"]["enum"] == strategies
    assert spec["properties"]["strategy"]["default"] == "Exclusive"
    assert any("strategy MIG needs spec.mig" in r["message"] for r in spec["x-kubernetes-validations"])
    profiles = spec["properties"]["mig"]["properties"]["profiles"]
    assert profiles["type"] == "object"
    assert profiles["maxProperties"] == 7
    values = spec["properties"]["mps"]["properties"]["compute"]["properties"]["values"]
    assert values["x-kubernetes-list-type"] == "set"
    assert values["items"] == {"type": "integer", "maximum": 100, "minimum": 1}


def test_node_layout_crd_lists_are_atomic() -> None:
    # One writer per side, by merge patch: atomic lists spare the apiserver a managedFields owner
    # per field of every GPU (tessera.models.layout says what that cost).
    crd = crds()["tessera.dev_nodelayouts.yaml"]
    assert crd["spec"]["names"]["shortNames"] == ["nl"]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    status = schema["properties"]["status"]["properties"]
    lists = [schema["properties"]["spec"]["properties"]["gpus"], status["gpus"], status["nics"], status["conditions"]]
    assert [(s["x-kubernetes-list-type"], "x-kubernetes-list-map-keys" in s) for s in lists] == [("atomic", False)] * 4
    start = status["gpus"]["items"]["properties"]["migInstances"]["items"]["properties"]["start"]
    assert (start["minimum"], start["maximum"]) == (0, 7)


@pytest.mark.parametrize(("model", "body", "message"), [
    (NodeLayoutSpec, {"gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}, {"uuid": "GPU-a"}]},
     "spec.gpus: uuid 'GPU-a' is listed twice"),
    (NodeLayoutStatus, {"gpus": [_GPU, _GPU]}, "status.gpus: uuid 'GPU-a' is listed twice"),
    (NodeLayoutStatus, {"nics": [{"interface": "eth1"}, {"interface": "eth1"}]},
     "status.nics: interface 'eth1' is listed twice"),
    (NodeLayoutStatus, {"conditions": [_READY, {**_READY, "status": "False"}]},
     "status.conditions: type 'Ready' is listed twice"),
])
def test_node_layout_keys_stay_unique_without_map_lists(model: type[KubeModel], body: dict[str, Any],
                                                         message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        model.from_kube(body)
    first = {key: value[:1] for key, value in body.items()}  # one of each reads
    assert len(getattr(model.from_kube(first), next(iter(body)))) == 1
