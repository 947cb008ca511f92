"""Reading the kubelet's own per-call DRA times from its --v=4 log: calls paired with their ends
by claim UID (also when two overlap, and when a value spans lines), other drivers and methods
left out, a call that never ended not counted."""

from __future__ import annotations

import pytest

from tessera.localcluster.kubeletlog import dra_calls

A = "5f0c2d8e-1111-4a2b-9c3d-000000000001"
B = "5f0c2d8e-1111-4a2b-9c3d-000000000002"
# As kubelet v1.36.5 writes them at --v=4 (the request and response are protobuf text).
TESSERA = ('logger="dra-plugin" driverName="gpu.tessera.dev" '
           'endpoint="/var/lib/kubelet/plugins/gpu.tessera.dev/dra.sock"')


def call(stamp: str, uid: str, driver: str = TESSERA, method: str = "NodePrepareResources") -> str:
    return (f'I1205 {stamp}   23725 dra_plugin.go:80] "Calling {method} rpc" {driver} '
            f'request="claims:{{namespace:\\"bench\\" uid:\\"{uid}\\" name:\\"c-0-gpu-v62nq\\"}}"\n')


def done(stamp: str, uid: str, driver: str = TESSERA, method: str = "NodePrepareResources") -> str:
    return (f'I1205 {stamp}   23725 dra_plugin.go:99] "Done calling {method} rpc" {driver} '
            f'response="claims:{{key:\\"{uid}\\" value:{{devices:{{device_name:\\"gpu-0\\"}}}}}}" err=null\n')


def test_overlapping_calls_are_paired_by_claim_uid_in_microseconds() -> None:
    log = [
        'I1205 08:00:00.000001    4242 kubelet.go:100] "SyncLoop ADD" source="api" pods=["bench/c-0"]\n',
        call("08:00:01.000000", A),
        call("08:00:01.002000", B),
        done("08:00:01.010500", B),
        done("08:00:01.012250", A),
    ]
    calls = dra_calls(log, "gpu.tessera.dev")
    assert [(sorted(c.claims), round(c.seconds, 6)) for c in calls] == [([B], 0.0085), ([A], 0.01225)]


def test_other_drivers_methods_and_unfinished_calls_are_left_out() -> None:
    nic = 'driverName="nic.tessera.dev" endpoint="/x"'
    log = [
        call("09:00:00.000000", A, driver=nic),
        done("09:00:00.500000", A, driver=nic),
        call("09:00:01.000000", A, method="NodeUnprepareResources"),
        done("09:00:01.300000", A, method="NodeUnprepareResources"),
        call("09:00:02.000000", B),
    ]
    assert dra_calls(log, "gpu.tessera.dev") == []
    (unprepare,) = dra_calls(log, "gpu.tessera.dev", "NodeUnprepareResources")
    assert unprepare.seconds == pytest.approx(0.3)


def test_a_multi_line_value_and_a_line_without_uids_still_pair() -> None:
    log = [
        f'I1205 10:00:00.100000    4242 dra_plugin.go:190] "Calling NodePrepareResources rpc" {TESSERA} request=<\n',
        f'\tclaims:{{uid:"{A}"}}\n',
        " >\n",
        f'I1205 10:00:00.120000    4242 dra_plugin.go:221] "Done calling NodePrepareResources rpc" {TESSERA} '
        'response=null err="context deadline exceeded"\n',
    ]
    (only,) = dra_calls(log, "gpu.tessera.dev")
    assert only.claims == frozenset({A})
    assert only.seconds == pytest.approx(0.02)
