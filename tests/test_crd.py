"""The CRDs in crds/ are generated from the models, stay in step with them, and are structural
(what the apiserver accepts); the integration test installs them into a real apiserver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.models.crd import crds, main, render, stale_files

CRD_DIR = Path(__file__).resolve().parents[1] / "crds"


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


def test_node_layout_crd_lists_are_maps_by_uuid() -> None:
    crd = crds()["tessera.dev_nodelayouts.yaml"]
    assert crd["spec"]["names"]["shortNames"] == ["nl"]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    gpus = schema["properties"]["status"]["properties"]["gpus"]
    assert gpus["x-kubernetes-list-type"] == "map"
    assert gpus["x-kubernetes-list-map-keys"] == ["uuid"]
    start = gpus["items"]["properties"]["migInstances"]["items"]["properties"]["start"]
    assert (start["minimum"], start["maximum"]) == (0, 7)
