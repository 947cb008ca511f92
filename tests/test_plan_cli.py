"""``tessera plan``: a table per node and GPU from policy and inventory files; exit 2 with a
readable reason for a bad policy or inventory, 1 when a GPU cannot be planned."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
POLICIES = sorted((EXAMPLES / "policies").glob("*.yaml"))


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


INVENTORY = """
nodes:
  - name: gpu-1
    labels: {pool: inference}
    simulate: 2xH100-80GB
"""


def _plan(*args: str | Path) -> list[str]:
    return ["plan", *(str(a) for a in args)]


def test_examples_plan_every_gpu_and_show_the_blocked_one(capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for p in POLICIES for a in ("--policy", p)]
    code = main(_plan(*args, "--inventory", EXAMPLES / "inventory.yaml"))
    out, err = capsys.readouterr()
    assert code == 1  # the example inventory has one GPU whose in-use instance blocks its layout
    header, *rows = out.splitlines()
    assert header.split()[:6] == ["NODE", "GPU", "MODEL", "POLICY", "STRATEGY", "LAYOUT"]
    assert any("inference-1" in r and "3g.40gb@4" in r and "shared by MPS" in r for r in rows)
    assert any("InUse: 3g.40gb needs memory slices 4-7; 1g.10gb at slice 5 is in use" in r for r in rows)
    assert any("NVIDIA L4" in r and "TimeSlicing" in r for r in rows)
    assert "big-memory-balanced wins over dev-time-slicing" in out
    assert "1 of 13 GPU(s) cannot be planned" in err


def test_all_planned_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _write(tmp_path, "inv.yaml", INVENTORY)
    code = main(_plan("--policy", EXAMPLES / "policies" / "h100-inference.yaml", "--inventory", inventory))
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("1g.10gb@0 1g.10gb@1 2g.20gb@2 3g.40gb@4") == 2


def test_bad_policy_exits_2_with_field_and_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = _write(
        tmp_path,
        "bad.yaml",
        """
apiVersion: tessera.dev/v1alpha1
kind: SharingPolicy
metadata: {name: bad}
spec:
  strategy: Mig
  mig: {preset: whole, profiles: {"1g.10gb": 9}}
""",
    )
    code = main(_plan("--policy", policy, "--inventory", _write(tmp_path, "inv.yaml", INVENTORY)))
    err = capsys.readouterr().err
    assert code == 2
    assert f"{policy}: SharingPolicy bad is invalid:" in err
    assert (
        "spec.strategy: Input should be 'Exclusive', 'MIG', 'DynamicMIG', 'TimeSlicing', 'MPS' or 'Adaptive' "
        "(got 'Mig')" in err
    )
    assert "spec.mig: spec.mig needs exactly one of profiles or preset" in err


def test_bad_gpu_selector_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = _write(
        tmp_path,
        "p.yaml",
        """
kind: SharingPolicy
metadata: {name: typo}
spec:
  gpuSelector: {cel: 'device.attributes["gpu.tessera.dev"].productName.startsWith('}
""",
    )
    code = main(_plan("--policy", policy, "--inventory", _write(tmp_path, "inv.yaml", INVENTORY)))
    assert code == 2
    assert "policy typo is invalid and selects nothing: gpuSelector" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("policy_text", "inventory_text", "message"),
    [
        ("kind: ConfigMap\n", INVENTORY, "no SharingPolicy in it"),
        (
            "kind: SharingPolicy\nmetadata: {name: a}\n---\nkind: SharingPolicy\nmetadata: {name: a}\n",
            INVENTORY,
            "the name is also used in",
        ),
        ("kind: SharingPolicy\nmetadata: {name: a}\nspec: [\n", INVENTORY, "not valid YAML"),
        (
            "kind: SharingPolicy\nmetadata: {name: a}\n",
            "nodes:\n  - name: x\n    simulate: 2xT4\n",
            "unknown GPU model 'T4'",
        ),
    ],
)
def test_bad_files_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy_text: str, inventory_text: str, message: str
) -> None:
    code = main(
        _plan(
            "--policy",
            _write(tmp_path, "p.yaml", policy_text),
            "--inventory",
            _write(tmp_path, "i.yaml", inventory_text),
        )
    )
    assert code == 2
    assert message in capsys.readouterr().err


def test_list_documents_are_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = _write(
        tmp_path,
        "list.yaml",
        """
kind: List
items:
  - {kind: SharingPolicy, metadata: {name: ts}, spec: {strategy: TimeSlicing}}
""",
    )
    assert main(_plan("--policy", policy, "--inventory", _write(tmp_path, "inv.yaml", INVENTORY))) == 0
    assert "4 replicas, Default interval" in capsys.readouterr().out
