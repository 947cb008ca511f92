"""The local control plane's build recipe, checked without building anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.localcluster.build import (
    LocalClusterError,
    ensure_binaries,
    kubernetes_wrapper_gomod,
    staging_replacements,
    version_ldflags,
)

KUBERNETES_GOMOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tgithub.com/google/uuid v1.6.0
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
\tk8s.io/kube-openapi v0.0.0-20260317180543-43fb72c5454a
)

require (
\tk8s.io/kms v0.0.0 // indirect
)
"""


def test_every_staging_module_at_v0_0_0_is_replaced_with_the_matching_release() -> None:
    assert staging_replacements(KUBERNETES_GOMOD, "v1.36.5") == [
        ("k8s.io/api", "v0.36.5"),
        ("k8s.io/client-go", "v0.36.5"),
    ]
    gomod = kubernetes_wrapper_gomod(KUBERNETES_GOMOD, "v1.36.5")
    assert "require k8s.io/kubernetes v1.36.5" in gomod
    assert "\tk8s.io/api => k8s.io/api v0.36.5" in gomod
    assert "kube-openapi" not in gomod, "pinned pseudo-versions are left as Kubernetes has them"
    assert "go 1.26.0" in gomod


def test_version_ldflags_make_version_report_the_release() -> None:
    flags = version_ldflags("v1.36.5")
    assert "-X k8s.io/component-base/version.gitVersion=v1.36.5" in flags
    assert "-X k8s.io/component-base/version.gitMinor=36" in flags
    with pytest.raises(LocalClusterError, match="not of the form"):
        version_ldflags("1.36")


def test_a_missing_go_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LocalClusterError, match="Go is not on PATH"):
        ensure_binaries()
    assert not (tmp_path / "bin").exists()
