"""DRA device model: turns what agents report into ResourceSlices for driver gpu.tessera.dev.

Pure code. Not for: talking to the API (``tessera.controller`` writes what this builds).
"""
