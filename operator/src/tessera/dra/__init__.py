"""DRA device model: turns what agents report into ResourceSlices for driver gpu.tessera.dev.

Pure code, one step per module: ``devices`` (a GPU → its devices and counter sets),
``slices`` (a node's devices → its pool's ResourceSlices), ``diff`` (desired vs existing →
the fewest writes and the pool generation), ``limits`` (the apiserver's slice rules,
offline), ``deviceclasses`` (the DeviceClasses the install ships).
Not for: talking to the API (``tessera.controller`` writes what this builds).
"""
