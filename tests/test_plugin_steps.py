"""Where a kubelet call's time goes (tessera.agent.plugin.steps): every step of a prepare and an
unprepare lands in the histogram under its own label, a step run twice adds up, and each call
logs one debug line with its steps; the exposition is the agent's own (no prometheus_client)."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from tessera.agent.plugin.claims import ClaimRef
from tessera.agent.plugin.steps import PluginMetrics, StepTimes
from tests.plugin_helpers import FakeClaimReader, PluginDirs, claim, dynamic, make_backend, preparer, result


def test_a_step_run_twice_adds_up_and_the_call_is_one_debug_line() -> None:
    metrics = PluginMetrics()
    times = StepTimes()
    times.add("checkpoint", 0.002)
    times.add("checkpoint", 0.003)
    times.add("cdi_write", 0.001)

    with capture_logs() as logs:
        metrics.record("prepare", times, "ns/c", "prepared")

    sample = metrics.registry.get_sample_value
    assert sample("tessera_agent_plugin_step_seconds_sum", {"operation": "prepare", "step": "checkpoint"}) == 0.005
    assert sample("tessera_agent_plugin_step_seconds_count", {"operation": "prepare", "step": "cdi_write"}) == 1
    (line,) = logs
    assert (line["event"], line["log_level"], line["claim"], line["outcome"]) == (
        "prepare steps", "debug", "ns/c", "prepared")
    assert line["steps_ms"] == {"checkpoint": 5.0, "cdi_write": 1.0}
    assert b'tessera_agent_plugin_step_seconds_bucket{le="0.005",operation="prepare",step="checkpoint"} 1.0' in (
        metrics.registry.exposition())


async def test_a_dynamic_mig_prepare_and_its_unprepare_time_every_step(tmp_path: Path) -> None:
    backend = make_backend()
    reader = FakeClaimReader()
    plugin = preparer(backend, reader, PluginDirs(tmp_path))
    await plugin.restore()
    body = claim("dyn", result(dynamic("1g.10gb", 0)))
    reader.add(body)
    ref = ClaimRef(body["metadata"]["namespace"], body["metadata"]["name"], body["metadata"]["uid"])
    try:
        await plugin.prepare(ref)
        await plugin.unprepare(ref)
    finally:
        backend.close()

    def count(operation: str, step: str) -> float | None:
        return plugin.metrics.registry.get_sample_value(
            "tessera_agent_plugin_step_seconds_count", {"operation": operation, "step": step})

    for step in ("lock", "checks", "claim_read", "hardware_lock", "hardware", "cdi_write", "checkpoint"):
        assert count("prepare", step) == 1, step
    assert plugin.metrics.registry.get_sample_value(
        "tessera_agent_plugin_step_seconds_sum", {"operation": "prepare", "step": "checkpoint"}
    ) > 0, "two checkpoints (the plan, then the prepared claim) add up in one observation"
    for step in ("lock", "cdi_remove", "release", "hardware", "checkpoint"):
        assert count("unprepare", step) == 1, step
