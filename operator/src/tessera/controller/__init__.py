"""The operator: Kopf handlers that turn SharingPolicies into NodeLayouts and NodeLayout
status into ResourceSlices, with per-GPU drain. Handlers are thin; logic lives in pure functions.
"""
