"""``tessera operator``'s flags: numbers in range, clear errors for the rest."""

from __future__ import annotations

import argparse

import pytest

from tessera.cli.operator import add_arguments


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_workers_and_grace_are_read_within_their_ranges() -> None:
    args = parse("--workers", "32", "--handover-grace", "2.5")
    assert (args.workers, args.handover_grace) == (32, 2.5)
    assert parse().workers == 8


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
