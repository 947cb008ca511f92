"""A short seeded fault campaign (see ``campaign.py``): policy churn and claims while the
operator, agents and apiserver are killed at random; every invariant must hold throughout.
``TESSERA_CAMPAIGN_SEED`` replays a run; ``benchmarks/fault_campaign.py`` runs long ones."""

from __future__ import annotations

import os

import pytest

from tessera.localcluster import LocalCluster
from tessera.localcluster.processes import TesseraProcesses
from tests.integration.campaign import Campaign

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("TESSERA_CAMPAIGN_SEED", "7"))
STEPS = int(os.environ.get("TESSERA_CAMPAIGN_STEPS", "45"))


async def test_a_seeded_fault_campaign_loses_no_allocated_device_and_converges(
    cluster: LocalCluster, tessera: TesseraProcesses
) -> None:
    campaign = Campaign(cluster, tessera, SEED)
    await campaign.setup()

    report = await campaign.run(STEPS)

    print(report.summary())
    assert report.faults > 0, "the campaign injected faults"
    assert report.checks > 10, "the invariants were looked at throughout"
    assert report.violations == []
    assert report.convergence, "every quiet period converged (wait_converged raises otherwise)"
    assert report.restart_writes == 0, f"a restart with nothing new writes nothing: {report.restart_write_kinds}"
