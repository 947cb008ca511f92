"""Plans a layout per GPU from SharingPolicies: matching, conflicts, MIG placement.

Pure code: values in, values out. Not for: I/O of any kind.
"""
