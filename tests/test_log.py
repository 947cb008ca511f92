"""Every log line names the component that wrote it: Tessera's structlog loggers
(``tessera.operator``, ``tessera.agent``) and the standard library's records (Kopf's)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from tessera.log import configure_logging


@pytest.fixture
def json_logs() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("json_logs")
def test_each_line_carries_its_components_name(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", json=True)

    structlog.get_logger("tessera.agent").info("reconciled", executed=1)
    structlog.get_logger("tessera.operator").warning("reconcile will be retried", node="n1")
    logging.getLogger("kopf.objects").warning("handler failed")

    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(line["logger"], line["event"]) for line in lines] == [
        ("tessera.agent", "reconciled"),
        ("tessera.operator", "reconcile will be retried"),
        ("kopf.objects", "handler failed"),
    ]
    assert lines[0]["executed"] == 1
    assert lines[1]["level"] == "warning"
