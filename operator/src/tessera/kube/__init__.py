"""The only modules that talk to the Kubernetes API: one small client (``http``), a
list-then-watch loop (``watch``), and typed helpers for the objects Tessera reads and writes.
Not for: deciding anything.
"""
