"""The real-node recipe, checked without starting anything: containerd's, the CNI's and the
kubelet's configuration, subnet choice, the image archive format, paths inside a node's mount
namespace, runc version parsing, and the containerd build command."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tomllib
from pathlib import Path

import pytest

from tessera.localcluster.images import docker_archive
from tessera.localcluster.nodebuild import (
    CONTAINERD_TAGS,
    NodeBinaries,
    containerd_install_args,
    find_cni_bin_dir,
    parse_runc_version,
)
from tessera.localcluster.nodes import (
    CDI_DIR,
    RealNode,
    cni_config,
    containerd_config,
    kubelet_config,
    pick_subnet,
    used_subnets,
)
from tessera.localcluster.pki import KUBERNETES_SERVICE_IP

BINARIES = NodeBinaries(
    kubelet=Path("/c/kubelet"),
    containerd=Path("/c/containerd"),
    containerd_shim=Path("/c/shim/containerd-shim-runc-v2"),
    ctr=Path("/c/ctr"), runc=Path("/usr/sbin/runc"), cni_bin_dir=Path("/usr/lib/cni"), busybox=Path("/bin/busybox"),
)


def test_containerd_config_keeps_everything_under_the_node_folder_and_sets_what_this_vm_needs() -> None:
    config = tomllib.loads(containerd_config(Path("/n/a"), BINARIES, "tessera.local/busybox:1"))
    assert config["version"] == 4
    assert config["imports"] == []  # never the host's /etc/containerd/conf.d
    assert config["root"] == "/n/a/containerd/root"
    assert config["state"] == "/n/a/containerd/state"
    plugins = config["plugins"]
    assert plugins["io.containerd.server.v1.grpc"]["address"] == "/n/a/containerd/containerd.sock"
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cdi_spec_dirs"] == [CDI_DIR]
    assert runtime["netns_mounts_under_state_dir"] is True
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == "/usr/sbin/runc"
    assert runtime["cni"] == {"bin_dirs": ["/usr/lib/cni"], "conf_dir": "/n/a/cni/conf", "max_conf_num": 1}
    images = plugins["io.containerd.cri.v1.images"]
    assert images["snapshotter"] == "native"
    assert images["pinned_images"]["sandbox"] == "tessera.local/busybox:1"
    assert "io.containerd.nri.v1.nri" in config["disabled_plugins"]  # its socket would be shared by all nodes


def test_the_shim_and_runc_come_first_on_containerds_path() -> None:
    assert BINARIES.runtime_path.split(":")[:2] == ["/c/shim", "/usr/sbin"]


def test_cni_config_uses_the_nodes_bridge_as_gateway_and_its_own_address_store() -> None:
    conf = cni_config("tsn7", "10.250.7.0/24", "10.250.7.1", Path("/n/a/cni/ipam"))
    bridge, loopback = conf["plugins"]
    assert bridge["bridge"] == "tsn7"
    assert bridge["isGateway"] is True
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.250.7.0/24", "gateway": "10.250.7.1"}]]
    assert bridge["ipam"]["dataDir"] == "/n/a/cni/ipam"
    assert loopback == {"type": "loopback"}


def test_kubelet_config_listens_on_the_node_ip_and_never_drops_local_images() -> None:
    config = kubelet_config("10.250.3.1", 40001, 40002, Path("/n/a/containerd/containerd.sock"), Path("/n/a/logs"))
    assert (config["address"], config["port"], config["healthzPort"]) == ("10.250.3.1", 40001, 40002)
    assert config["containerRuntimeEndpoint"] == "unix:///n/a/containerd/containerd.sock"
    assert config["failCgroupV1"] is False
    assert config["cgroupsPerQOS"] is False
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["authorization"] == {"mode": "AlwaysAllow"}
    assert config["podLogsDir"] == "/n/a/logs"


def test_a_free_subnet_is_one_no_interface_uses() -> None:
    output = (
        "1: lo    inet 127.0.0.1/8 scope host lo\n"
        "5: tsn1    inet 10.250.1.1/24 scope global tsn1\n"
        "6: tsn2    inet 10.250.2.1/24 scope global tsn2\n"
        "7: eth0    inet 10.2500.3.1/24 scope global eth0\n"
    )
    assert used_subnets(output) == {1, 2}
    assert pick_subnet(output) == 3


def test_paths_inside_a_node_map_to_its_folder() -> None:
    node = RealNode(name="a", folder=Path("/n/a"), binaries=BINARIES, cluster=None)  # type: ignore[arg-type]  # no cluster needed for paths
    assert node.host_path("/var/lib/kubelet/plugins_registry") == Path("/n/a/kubelet/plugins_registry")
    assert node.host_path("/var/run/cdi") == Path("/n/a/cdi")
    assert node.host_path("/var/lib/tessera/simulated-gpus.json") == Path("/n/a/var-lib-tessera/simulated-gpus.json")
    assert node.host_path("/etc/hosts") == Path("/etc/hosts")


def test_pods_reach_the_apiserver_at_an_address_its_certificate_names() -> None:
    assert KUBERNETES_SERVICE_IP == "10.96.0.1"  # the first address of --service-cluster-ip-range 10.96.0.0/16


def test_a_docker_archive_has_the_layout_ctr_imports() -> None:
    layer = b"layer-bytes"
    raw = docker_archive(layer, "x.local/y:1", ["sleep", "1"], ["PATH=/bin"])
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive.getmembers()}  # type: ignore[union-attr]  # regular files only
    manifest = json.loads(members["manifest.json"])
    assert manifest[0]["RepoTags"] == ["x.local/y:1"]
    assert manifest[0]["Layers"] == ["layer.tar"]
    assert members["layer.tar"] == layer
    config_bytes = members[manifest[0]["Config"]]
    assert manifest[0]["Config"] == hashlib.sha256(config_bytes).hexdigest() + ".json"
    config = json.loads(config_bytes)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Cmd"] == ["sleep", "1"]


@pytest.mark.parametrize(
    ("output", "version"),
    [
        ("runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\n", (1, 1, 5)),
        ("runc version 1.5.0\ncommit: v1.5.0-0-g\n", (1, 5, 0)),
        ("something else", None),
    ],
)
def test_runc_versions_are_read_from_its_version_output(output: str, version: tuple[int, int, int] | None) -> None:
    assert parse_runc_version(output) == version


def test_containerd_is_installed_at_its_version_without_the_snapshotters_that_need_cgo() -> None:
    args = containerd_install_args("v2.4.2", Path("/tmp/out"))
    assert args[:2] == ["install", "-trimpath"]
    assert args[args.index("-tags") + 1] == CONTAINERD_TAGS == "no_btrfs no_devmapper no_zfs"
    assert "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@v2.4.2" in args
    assert "-X github.com/containerd/containerd/v2/version.Version=v2.4.2" in args[args.index("-ldflags") + 1]


def test_missing_cni_plugins_are_named_with_the_package_that_has_them(tmp_path: Path) -> None:
    (tmp_path / "bridge").write_text("")
    with pytest.raises(Exception, match="containernetworking-plugins"):
        find_cni_bin_dir((tmp_path,))
