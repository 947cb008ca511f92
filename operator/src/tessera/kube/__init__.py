"""The only modules that talk to the Kubernetes API: client construction and small,
typed helpers for the objects Tessera reads and writes. Not for: deciding anything.
"""
