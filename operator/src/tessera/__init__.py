"""Tessera: share GPUs on Kubernetes through Dynamic Resource Allocation.

The package is layered (an import-linter contract keeps it so):
``cli`` → ``controller`` | ``agent`` | ``localcluster`` → ``kube`` | ``dra`` | ``planner`` → ``models``.
"""

__version__ = "0.1.0"

API_GROUP = "tessera.dev"
API_VERSION = "v1alpha1"
DRIVER_NAME = "gpu.tessera.dev"
INSTALL_NAMESPACE = "tessera-system"
