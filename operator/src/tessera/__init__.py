"""Tessera: share GPUs on Kubernetes through Dynamic Resource Allocation.

The package is layered (an import-linter contract keeps it so):
``cli`` → ``controller`` | ``agent`` | ``localcluster`` → ``kube`` | ``dra`` | ``planner`` → ``models``.
"""

__version__ = "0.1.0"

API_GROUP = "tessera.dev"
API_VERSION = "v1alpha1"  # of Tessera's own kinds: SharingPolicy, NodeLayout
# of the DRA kinds: ResourceSlice, DeviceClass, ResourceClaim
RESOURCE_GROUP, RESOURCE_VERSION = "resource.k8s.io", "v1"
RESOURCE_API_VERSION = f"{RESOURCE_GROUP}/{RESOURCE_VERSION}"
DRIVER_NAME = "gpu.tessera.dev"
INSTALL_NAMESPACE = "tessera-system"
