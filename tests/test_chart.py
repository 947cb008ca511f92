"""The Helm chart's files (charts/tessera), without helm: its generated parts (CRDs, the
DeviceClasses template) stay in step with the code, every value is documented in values.yaml and
described by values.schema.json, which refuses keys it does not know, and the monitoring extras
name only metrics the code exports. What helm makes of the chart (lint, templates equal to
manifests/, refusals) is tests/integration/test_chart_helm.py's job."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tessera.chart import generated_files, main, stale_files

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "tessera"
SRC = ROOT / "operator" / "src" / "tessera"


def test_the_generated_chart_files_are_what_the_code_makes() -> None:
    assert stale_files(CHART) == [], "run: python -m tessera.chart --write charts/tessera"
    assert main(["--check", str(CHART)]) == 0


def test_a_drifted_chart_file_is_reported_with_the_command_that_fixes_it(tmp_path: Path, capsys: Any) -> None:
    for name, text in generated_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "crds" / "tessera.dev_old.yaml").write_text("kind: CustomResourceDefinition\n")
    (tmp_path / "templates" / "deviceclasses.yaml").write_text("edited by hand\n")
    assert main(["--check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "templates/deviceclasses.yaml is out of date: run python -m tessera.chart --write" in out
    assert "crds/tessera.dev_old.yaml" in out


def test_the_chart_crds_are_the_repository_crds() -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        ours = yaml.safe_load((CHART / "crds" / path.name).read_text())
        assert ours == yaml.safe_load(path.read_text()), path.name


def _leaves(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value) and not _is_free_map(path):
            out.update(_leaves(value, path))
        else:
            out[path] = value
    return out


FREE_MAPS = ("nodeSelector", "resources", "labels", "podLabels", "podAnnotations", "affinity")


def _is_free_map(path: str) -> bool:
    return path.rsplit(".", 1)[-1] in FREE_MAPS


def _schema_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        assert node.get("additionalProperties") is False, f"{path}: the schema must refuse unknown keys above it"
        node = node["properties"][part]
    return node


def test_every_value_is_in_the_schema_and_the_schema_refuses_unknown_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path, value in _leaves(values).items():
        described = _schema_at(schema, path)
        assert described.get("description"), f"{path}: no description in the schema"
        kinds = {"string": str, "integer": int, "boolean": bool, "object": dict, "array": list}
        if "type" in described:
            assert isinstance(value, kinds[described["type"]]), f"{path}: default {value!r} is not {described['type']}"
        if "enum" in described:
            assert value in described["enum"], path
        if "pattern" in described:
            assert re.search(described["pattern"], value), f"{path}: default {value!r} fails its own pattern"
    schema_keys = {k for k in schema["properties"] if k != "global"}
    assert schema_keys == set(values), "values.yaml and values.schema.json name different top-level keys"


def test_every_line_of_values_yaml_that_sets_a_key_is_documented_by_a_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for number, line in enumerate(lines):
        if not re.match(r"^\s*[A-Za-z][\w.-]*:", line):
            continue
        before = next((p for p in reversed(lines[:number]) if p.strip()), "")
        if not before.strip().startswith("#"):
            undocumented.append(f"{number + 1}: {line.strip()}")
    assert undocumented == []


def test_the_alerts_and_the_dashboard_use_only_metrics_the_code_exports() -> None:
    exported = set()
    for path in SRC.rglob("*.py"):
        exported |= set(re.findall(r'"(tessera_(?:operator|agent)_[a-z_]+)"', path.read_text()))
    assert "tessera_operator_policy_degraded" in exported
    used = set()
    dashboard = json.loads((CHART / "dashboards" / "tessera.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"tessera_[a-z_]+", target["expr"]))
    used |= set(re.findall(r"tessera_[a-z_]+", (CHART / "templates" / "prometheusrule.yaml").read_text()))
    suffixes = ("_total", "_bucket", "_count", "_sum")
    unknown = {m for m in used if m not in exported and not any(
        m.endswith(s) and m[: -len(s)] in exported for s in suffixes)}
    assert unknown == set()
    assert len(dashboard["panels"]) >= 10
