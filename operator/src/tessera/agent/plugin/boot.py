"""Which boot of the node a checkpoint was written in, and what survives a reboot of it.

A reboot ends every container, clears /run (the CDI specs under /var/run/cdi, the MPS pipe
folders) and resets the GPUs (MIG instances gone), while the plugin's checkpoint under
/var/lib/kubelet stays. So a claim the checkpoint calls prepared in an earlier boot is not in
use by anything now: holding its devices would keep the reconciler from re-applying the
layout around a partition nobody uses. The kubelet prepares again (NodePrepareResources)
every claim of a Pod that comes back after a reboot — it keeps no "prepared" flag across a
restart (kubernetes/kubernetes#141966) — and that prepare writes the CDI spec anew.

The boot is the kernel's ``/proc/sys/kernel/random/boot_id``, a new random UUID each boot (a
real node of the local cluster has its own, bound over that file in its mount namespace).
Pure apart from ``read_boot_id``. Not for: reading or writing the checkpoint (``.checkpoint``).
"""

from __future__ import annotations

from pathlib import Path

from tessera.agent.plugin.checkpoint import CheckpointData

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def read_boot_id(path: Path = BOOT_ID_FILE) -> str | None:
    """This boot's id, or None where the kernel does not tell (not Linux)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def from_an_earlier_boot(data: CheckpointData | None, boot_id: str | None) -> bool:
    """Whether ``data`` was written in another boot than ``boot_id``. A checkpoint that names no
    boot (written before boots were recorded) or a node that tells none counts as this boot:
    its claims are kept, as they were before."""
    return data is not None and data.boot_id is not None and boot_id is not None and data.boot_id != boot_id
