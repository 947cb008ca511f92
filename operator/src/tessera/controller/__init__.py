"""The operator: Kopf handlers (SharingPolicies, ResourceClaims) and plain watches (Nodes,
NodeLayouts, our ResourceSlices) that turn SharingPolicies into NodeLayouts and NodeLayout
status into ResourceSlices, with per-GPU drain. Handlers are thin; logic lives in pure functions.
"""
