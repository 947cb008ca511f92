"""Container images made on this machine, for real nodes that cannot reach a registry.

``busybox_image`` writes a docker-archive tar (``manifest.json``, the image config and one
layer) whose only file is a statically linked busybox plus a link per applet: the sandbox
("pause") image of every real node and the image the tests' and the demo's workloads run.
``import_image`` loads such a tar into a node's containerd (namespace ``k8s.io``, where the
CRI plugin looks). Not for: building Tessera's own image (``tessera.localcluster.ownimage``).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

from tessera.localcluster.build import LocalClusterError

BUSYBOX_IMAGE = "tessera.local/busybox:1"
SANDBOX_SLEEP_SECONDS = "2147483647"


def busybox_applets(busybox: Path) -> list[str]:
    proc = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LocalClusterError(f"{busybox} --list failed: {proc.stderr.strip()}")
    return sorted({a for a in proc.stdout.split() if a and "/" not in a and a != "busybox"})


def _layer(busybox: Path, applets: list[str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("bin", "tmp", "etc"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in applets:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(link)
        passwd = b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size, info.mode = len(passwd), 0o644
        tar.addfile(info, io.BytesIO(passwd))
    return buffer.getvalue()


def docker_archive(layer: bytes, tag: str, cmd: list[str], env: list[str]) -> bytes:
    """A docker-archive tar of one layer: what ``docker save`` writes and ``ctr import`` reads."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": cmd, "Env": env, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "tessera.localcluster.images"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("layer.tar", layer), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def busybox_image(busybox: Path, out: Path, tag: str = BUSYBOX_IMAGE) -> Path:
    """Write the busybox image's docker-archive to ``out`` (once; it is the same every time)."""
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        archive = docker_archive(
            _layer(busybox, busybox_applets(busybox)), tag, ["sleep", SANDBOX_SLEEP_SECONDS],
            ["PATH=/bin"],
        )
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(archive)
        tmp.replace(out)
    return out


def import_image(ctr: Path, address: str, archive: Path, snapshotter: str = "native") -> None:
    """``ctr -n k8s.io images import`` into the containerd listening on ``address``."""
    proc = subprocess.run(
        [str(ctr), "--address", address, "-n", "k8s.io", "images", "import", "--snapshotter", snapshotter,
         "--platform", "linux/amd64", "--local", str(archive)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    if proc.returncode != 0:
        raise LocalClusterError(f"importing {archive} into {address} failed: {proc.stderr.strip()[-2000:]}")
