"""The recipe that builds ``helm`` into the control plane's cache, checked without building."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tessera.localcluster.build import LocalClusterError
from tessera.localcluster.helmbuild import HELM_VERSION, ensure_helm, helm_install_args, helm_path


def test_helm_lives_beside_the_control_plane_in_a_folder_named_after_its_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    assert helm_path() == tmp_path / "bin" / f"helm-{HELM_VERSION}" / "helm"
    assert HELM_VERSION.startswith("v4.")


def test_the_build_pins_the_release_and_makes_helm_version_tell_it() -> None:
    args = helm_install_args("v4.3.2")
    assert args[0] == "install"
    assert args[-1] == "helm.sh/helm/v4/cmd/helm@v4.3.2"
    ldflags = args[args.index("-ldflags") + 1]
    assert "-X helm.sh/helm/v4/internal/version.version=v4.3.2" in ldflags
    assert "-trimpath" in args


def test_a_built_helm_is_used_as_it_is_and_a_missing_go_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LocalClusterError, match="Go is not on PATH"):
        ensure_helm()
    assert not helm_path().exists()
    helm_path().parent.mkdir(parents=True)
    helm_path().write_text("#!/bin/sh\necho built\n")
    os.chmod(helm_path(), 0o755)
    assert ensure_helm() == helm_path()
    assert subprocess.run([str(ensure_helm())], capture_output=True, text=True, check=True).stdout == "built\n"
