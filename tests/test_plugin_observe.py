"""How long the kubelet plugin takes per claim reaches the agent's metrics: every prepare and
unprepare answer, good or bad, is observed once with its operation, result and seconds, and
``tessera_agent_claim_seconds`` (the chart dashboard's prepare latency) counts them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tessera.agent.plugin import KubeletPlugin, PluginConfig
from tessera.agent.plugin.claims import ClaimRef
from tessera.agent.service import AgentMetrics
from tests.plugin_helpers import (
    NAMESPACE,
    NODE,
    WHOLE,
    FakeClaimReader,
    PluginDirs,
    claim,
    make_backend,
    result,
    short_tmp_dir,
)


@pytest.fixture
def dirs() -> Iterator[PluginDirs]:
    for root in short_tmp_dir():
        yield PluginDirs(root)


def _ref(body: dict[str, object]) -> ClaimRef:
    meta = body["metadata"]
    assert isinstance(meta, dict)
    return ClaimRef(NAMESPACE, str(meta["name"]), str(meta["uid"]))


async def test_each_claim_answer_is_observed_with_its_operation_result_and_seconds(dirs: PluginDirs) -> None:
    seen: list[tuple[str, str, float]] = []
    metrics = AgentMetrics()
    reader = FakeClaimReader()
    good, elsewhere = claim("good", result(WHOLE)), claim("elsewhere", result(WHOLE, pool="gpu-node-2"))
    reader.add(good, elsewhere)
    config = PluginConfig(node_name=NODE, registry_dir=dirs.registry, plugin_dir=dirs.plugin, cdi_dir=dirs.cdi,
                          proc_root=dirs.proc)

    def observe(operation: str, outcome: str, seconds: float) -> None:
        seen.append((operation, outcome, seconds))
        metrics.observe_claim(operation, outcome, seconds)

    plugin = KubeletPlugin(config, make_backend(), reader, observe=observe)
    prepared = await plugin.prepare_claims([_ref(good), _ref(elsewhere)])
    await plugin.unprepare_claims([_ref(good)])

    assert prepared[_ref(elsewhere).uid].error
    assert sorted((op, outcome) for op, outcome, _ in seen) == [
        ("prepare", "error"), ("prepare", "ok"), ("unprepare", "ok")]
    assert all(0 <= seconds < 30 for _, _, seconds in seen)
    text = metrics.registry.exposition().decode()
    assert 'tessera_agent_claim_seconds_count{operation="prepare",result="ok"} 1.0' in text
    assert 'tessera_agent_claim_seconds_count{operation="prepare",result="error"} 1.0' in text
    assert 'tessera_agent_claim_seconds_count{operation="unprepare",result="ok"} 1.0' in text
