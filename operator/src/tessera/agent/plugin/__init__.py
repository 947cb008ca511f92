"""The DRA kubelet plugin of the node agent: the gRPC services the kubelet calls to prepare
and unprepare ResourceClaims that were allocated Tessera's devices on this node.

Start it from the agent process with ``serve_plugin`` (or ``KubeletPlugin`` as an async context
manager) and ask the running plugin ``in_use_device_uuids()`` for the devices the reconciler
must leave alone. Modules: ``server`` (gRPC, sockets), ``prepare`` (the steps that act),
``access`` (what a container gets and what is recorded of a claim: pure builders), ``claims``
(reading claims), ``watched`` (a claim from the agent's watch, confirmed by a read alongside),
``cdi`` (spec files), ``checkpoint`` (state on disk), ``hardware`` (what it needs from the
DeviceBackend), ``proto`` (the kubelet's wire contracts).
Not for: the reconciler or the backends (``tessera.agent``).
"""

from tessera.agent.plugin.claims import ClaimError, ClaimReader, ClaimRef, KubeClaimReader
from tessera.agent.plugin.hardware import PluginBackend
from tessera.agent.plugin.server import KubeletPlugin, PluginConfig, serve_plugin

__all__ = [
    "ClaimError",
    "ClaimReader",
    "ClaimRef",
    "KubeClaimReader",
    "KubeletPlugin",
    "PluginBackend",
    "PluginConfig",
    "serve_plugin",
]
