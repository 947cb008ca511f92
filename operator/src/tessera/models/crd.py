"""CustomResourceDefinitions generated from the pydantic models: the YAML in ``crds/``.

The models are the single source of truth; this module turns their JSON schema into the
structural OpenAPI v3 schema the apiserver wants: ``$ref`` inlined, ``Optional[X]`` as a
plain ``X`` (no ``anyOf``/``null``), enums, bounds, patterns and defaults kept,
``x-kubernetes-*`` extensions (CEL validations, list types) carried through, titles and
examples dropped, ``metadata`` left as ``type: object``.

Regenerate after changing a model (a test fails while ``crds/`` is out of date)::

    python -m tessera.models.crd --write crds/
    python -m tessera.models.crd --check crds/     # exit 1 when the files differ

Not for: installing CRDs into a cluster (``kubectl apply -f crds/``, or the operator's install).
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from tessera import API_GROUP, API_VERSION
from tessera.models.generated import differing, report_stale, write_files
from tessera.models.layout import NodeLayoutSpec, NodeLayoutStatus
from tessera.models.network import NetworkSharingPolicySpec, NetworkSharingPolicyStatus
from tessera.models.policy import SharingPolicySpec, SharingPolicyStatus

Schema = dict[str, Any]

# Keys that describe a schema to people or to pydantic, not to the apiserver.
_DROP = {"title", "examples", "$defs"}


def _resolve(node: Any, defs: dict[str, Schema]) -> Any:
    """Inline every ``$ref`` (recursively), keeping keys written beside the ref."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        beside = {k: v for k, v in node.items() if k != "$ref"}
        if "description" in beside:
            target.pop("description", None)
        return _resolve({**target, **beside}, defs)
    return {k: _resolve(v, defs) for k, v in node.items()}


def _merge(base: Schema, extra: Schema) -> Schema:
    """``extra`` laid over ``base``; nested schemas (``items``) merge key by key."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def structural(node: Any) -> Any:
    """A resolved pydantic schema made structural for the apiserver (see the module doc)."""
    if isinstance(node, list):
        return [structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "anyOf" in node:
        variants = [v for v in node.pop("anyOf") if v.get("type") != "null"]
        if len(variants) != 1:
            raise ValueError(f"a CRD schema cannot say 'one of {len(variants)} types': {variants}")
        if node.get("default", 0) is None:
            del node["default"]
        node = _merge(variants[0], node)
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    _openapi_v3_bounds(node)
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: structural(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = structural(value)
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return _ordered(out)


def _openapi_v3_bounds(node: Schema) -> None:
    """JSON Schema's numeric ``exclusiveMaximum: N`` is OpenAPI v3.0's ``maximum: N`` with
    ``exclusiveMaximum: true``; for integers, plainly ``maximum: N - 1``."""
    for bound, limit, step in (("exclusiveMaximum", "maximum", -1), ("exclusiveMinimum", "minimum", 1)):
        value = node.get(bound)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if node.get("type") == "integer":
            del node[bound]
            node[limit] = int(value) + step
        else:
            node[limit] = value
            node[bound] = True


_ORDER = ("description", "type", "format", "enum", "default", "required", "properties", "items", "additionalProperties")


def _ordered(schema: Schema) -> Schema:
    """Keys in a fixed, readable order (so generated files are stable and diff well)."""
    head = [k for k in _ORDER if k in schema]
    tail = sorted(k for k in schema if k not in _ORDER)
    return {k: schema[k] for k in head + tail}


def model_schema(model: type[BaseModel]) -> Schema:
    """The structural schema of one model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    resolved = _resolve(raw, raw.get("$defs", {}))
    schema: Schema = structural(resolved)
    return schema


def _object_schema(spec: type[BaseModel], status: type[BaseModel], description: str) -> Schema:
    spec_schema = model_schema(spec)
    spec_schema.pop("description", None)
    status_schema = model_schema(status)
    status_schema.pop("description", None)
    return {
        "description": description,
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }


def _crd(
    kind: str,
    plural: str,
    short_names: list[str],
    schema: Schema,
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Cluster",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["tessera"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


_READY = '.status.conditions[?(@.type=="Ready")].status'
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def sharing_policy_crd() -> dict[str, Any]:
    schema = _object_schema(
        SharingPolicySpec,
        SharingPolicyStatus,
        "SharingPolicy says how the GPUs it selects are cut up (MIG) and shared "
        "(time-slicing, MPS). Where several policies select one GPU, the highest priority wins, then the name.",
    )
    columns: list[dict[str, Any]] = [
        {"name": "Strategy", "type": "string", "jsonPath": ".spec.strategy"},
        {"name": "Priority", "type": "integer", "jsonPath": ".spec.priority", "priority": 1},
        {"name": "Ready", "type": "string", "jsonPath": _READY},
        {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes"},
        {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus"},
        {"name": "Applied", "type": "integer", "jsonPath": ".status.gpusApplied", "priority": 1},
        {"name": "Devices", "type": "integer", "jsonPath": ".status.devicesPublished", "priority": 1},
        {"name": "Recut", "type": "integer", "jsonPath": ".status.gpusRecut", "priority": 1},
        {"name": "Idle-Layout", "type": "string", "jsonPath": ".spec.adaptive.idle", "priority": 1},
        _AGE,
    ]
    return _crd("SharingPolicy", "sharingpolicies", ["sp"], schema, columns)


def node_layout_crd() -> dict[str, Any]:
    schema = _object_schema(
        NodeLayoutSpec,
        NodeLayoutStatus,
        "NodeLayout is one node's GPU layout: spec is what the operator wants per GPU, "
        "status is what the node agent found and made.",
    )
    columns: list[dict[str, Any]] = [
        {"name": "Ready", "type": "string", "jsonPath": _READY},
        {"name": "Backend", "type": "string", "jsonPath": ".status.backend"},
        {"name": "Agent", "type": "string", "jsonPath": ".status.agentVersion", "priority": 1},
        _AGE,
    ]
    return _crd("NodeLayout", "nodelayouts", ["nl"], schema, columns)


def network_sharing_policy_crd() -> dict[str, Any]:
    schema = _object_schema(
        NetworkSharingPolicySpec,
        NetworkSharingPolicyStatus,
        "NetworkSharingPolicy says which NICs are sold in bandwidth shares, and how big a share is. "
        "Where several policies select one NIC, the highest priority wins, then the name.",
    )
    schema["required"] = ["spec"]
    columns: list[dict[str, Any]] = [
        {"name": "Interfaces", "type": "string", "jsonPath": ".spec.interfaces"},
        {"name": "Share", "type": "string", "jsonPath": ".spec.share.default"},
        {"name": "Ready", "type": "string", "jsonPath": _READY},
        {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes"},
        {"name": "NICs", "type": "integer", "jsonPath": ".status.nics"},
        _AGE,
    ]
    return _crd("NetworkSharingPolicy", "networksharingpolicies", ["nsp"], schema, columns)


def crds() -> dict[str, dict[str, Any]]:
    """File name → CRD, for every CRD Tessera ships."""
    return {
        f"{API_GROUP}_sharingpolicies.yaml": sharing_policy_crd(),
        f"{API_GROUP}_nodelayouts.yaml": node_layout_crd(),
        f"{API_GROUP}_networksharingpolicies.yaml": network_sharing_policy_crd(),
    }


_HEADER = "# Generated by `python -m tessera.models.crd --write crds/` from tessera.models; do not edit.\n"


def render(crd: dict[str, Any]) -> str:
    return _HEADER + yaml.safe_dump(crd, sort_keys=False, width=120, allow_unicode=True)


def rendered() -> dict[str, str]:
    """Every CRD file's text, by file name."""
    return {name: render(crd) for name, crd in crds().items()}


def stale_files(folder: Path) -> list[str]:
    """The CRD files in ``folder`` that are missing or differ from the models."""
    return differing(folder, rendered())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.models.crd", description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", metavar="DIR", type=Path, help="write the CRD files into DIR")
    action.add_argument("--check", metavar="DIR", type=Path, help="exit 1 when DIR's files differ from the models")
    args = parser.parse_args(argv)
    if args.check is not None:
        return report_stale(args.check, stale_files(args.check), f"python -m tessera.models.crd --write {args.check}")
    return write_files(args.write, rendered())


if __name__ == "__main__":
    sys.exit(main())
