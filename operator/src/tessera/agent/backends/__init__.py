"""GPU backends behind one protocol: ``base`` (the ``DeviceBackend`` protocol and its errors),
``nvml`` (real hardware, the only module that imports pynvml) and ``simulated`` (GPUs from the
catalog, deterministic per node). Not for: deciding layouts or talking to Kubernetes.
"""
