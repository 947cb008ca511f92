"""The NIC device family on a node: discovery (sysfs, or simulated), and shares of an uplink
made and enforced in the host's network namespace (a macvlan per share, HTB classes on the
uplink and on an ifb), with a checkpoint of what was made.

Not for: publishing devices (``tessera.dra.nics``) or GPUs (``tessera.agent.backends``).
"""
