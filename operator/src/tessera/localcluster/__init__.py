"""A real local Kubernetes control plane for tests, the demo and benchmarks, without Docker.

``build`` compiles etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl
from the Go module proxy on first use and caches them; ``cluster`` starts them on loopback
and stops them again. There is no kubelet: Nodes are objects posted with a Ready status, and
GPU nodes are Tessera agents with the simulated backend. Not for: production clusters.
"""

from tessera.localcluster.build import Binaries, LocalClusterError, ensure_binaries
from tessera.localcluster.cluster import LocalCluster

__all__ = ["Binaries", "LocalCluster", "LocalClusterError", "ensure_binaries"]
