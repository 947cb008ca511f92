"""The README's install instructions stay true: every Debian package real nodes and the image
build need is in its install line and in what scripts/bootstrap installs as root on Debian, and
Helm comes first, kubectl apply second."""

from __future__ import annotations

import re
from pathlib import Path

from tessera.localcluster.nodebuild import DEBIAN_PACKAGES
from tessera.localcluster.ownimage import DEBIAN_TOOLS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_install_line_and_bootstrap_name_every_package_real_nodes_need() -> None:
    needed = {*DEBIAN_PACKAGES, *DEBIAN_TOOLS}
    assert "iptables" in needed
    line = re.search(r"`apt-get install ([^`]+)`", README.replace("\n", " "))
    assert line is not None, "the README has an apt-get install line"
    assert needed <= set(line.group(1).split())
    bootstrap = re.search(r"packages=\(([^)]*)\)", (ROOT / "scripts" / "bootstrap").read_text())
    assert bootstrap is not None
    assert needed <= set(bootstrap.group(1).split())


def test_the_readme_shows_helm_first_and_kubectl_apply_second() -> None:
    install = README[README.index("## Install on a real cluster"):]
    assert install.index("helm install tessera charts/tessera") < install.index(
        "kubectl apply --server-side -f manifests/install.yaml")
    assert README.startswith("# Tessera\n\n```sh\n./scripts/demo ")
    assert "./scripts/check" in README.splitlines()[4]
