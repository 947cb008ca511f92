"""Adaptive layouts: the pure planning room that matches waiting claims to the layouts an
``Adaptive`` SharingPolicy's menu offers, and picks which idle GPUs to recut.

It sits between the controller and ``tessera.dra`` / ``tessera.planner`` because it needs
both: the planner to plan a menu layout on a GPU, the device builder to know what that layout
would publish, and the planner's CEL path to run claims' selectors on those devices. No I/O.
Not for: watching claims or Pods, timers, or writing anything (``tessera.controller.demand``).
"""
