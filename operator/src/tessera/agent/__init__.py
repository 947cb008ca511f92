"""The node agent: GPU backends (NVML, simulated), layout reconciliation, NodeLayout status,
and the DRA kubelet plugin. The only part of Tessera that touches GPUs.
"""
