"""``tessera operator``'s flags: numbers in range, clear errors for the rest; its defaults and
``tessera agent``'s are the constants they mirror."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from tessera.agent.service import AgentConfig
from tessera.cli import agent as agent_cli
from tessera.cli.operator import add_arguments
from tessera.controller.runtime import DEFAULT_HANDOVER_GRACE, DEFAULT_WORKERS


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_workers_and_grace_are_read_within_their_ranges() -> None:
    args = parse("--workers", "32", "--handover-grace", "2.5")
    assert (args.workers, args.handover_grace) == (32, 2.5)


def test_the_defaults_are_the_controllers_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_WORKERS", raising=False)
    monkeypatch.delenv("TESSERA_HANDOVER_GRACE", raising=False)
    args = parse()
    assert (args.workers, args.handover_grace) == (DEFAULT_WORKERS, DEFAULT_HANDOVER_GRACE)


def test_the_agents_defaults_are_its_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("METRICS_PORT", "METRICS_HOST", "RESYNC_SECONDS", "HEALTH_RECOVERY_SECONDS"):
        monkeypatch.delenv(f"TESSERA_{name}", raising=False)
    parser = argparse.ArgumentParser()
    agent_cli.add_arguments(parser)
    args = parser.parse_args([])
    config = AgentConfig(node_name="n")
    assert (args.metrics_port, args.metrics_host, args.resync_seconds, args.health_recovery_seconds) == (
        config.metrics_port, config.metrics_host, config.resync_seconds, config.health_recovery_seconds)


@pytest.mark.parametrize(("argv", "message"), [
    (("--workers", "0"), "0 workers is out of range: give 1 to 256"),
    (("--workers", "many"), "'many' is not a number of workers"),
    (("--handover-grace", "61"), "61 seconds is out of range"),
    (("--handover-grace", "soon"), "'soon' is not a number of seconds"),
])
def test_a_bad_number_is_refused_with_what_was_wrong(argv: tuple[str, ...], message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)
    assert message in capsys.readouterr().err


def test_lease_timing_defaults_to_client_gos_and_is_read_from_flags() -> None:
    args = parse()
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (15.0, 10.0, 2.0)
    assert (args.lease_namespace, args.lease_name) == ("tessera-system", "tessera-operator")
    args = parse("--lease-duration", "30", "--renew-deadline", "20", "--retry-period", "4")
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (30.0, 20.0, 4.0)


def test_a_renew_deadline_not_below_the_lease_duration_is_refused_naming_the_flags() -> None:
    from tessera.cli.operator import run

    args = parse("--lease-duration", "10", "--renew-deadline", "10")
    with pytest.raises(SystemExit, match=r"--lease-duration, --renew-deadline.*renew deadline \(10.0\)"):
        run(args)


@pytest.mark.parametrize("argv", [
    ("operator", "--kubeconfig", "/nonexistent"),
    ("agent", "--node-name", "n", "--backend", "simulated", "--simulate", "1xH100-80GB",
     "--kubeconfig", "/nonexistent"),
])
def test_a_bad_watch_idle_bound_stops_the_operator_and_the_agent_before_they_start(argv: tuple[str, ...]) -> None:
    done = subprocess.run([sys.executable, "-m", "tessera", *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TESSERA_IDLE_TIMEOUT": "soon"}, check=False)
    assert done.returncode != 0
    assert "TESSERA_IDLE_TIMEOUT='soon'" in done.stdout + done.stderr
    assert "a number above 0" in done.stdout + done.stderr
