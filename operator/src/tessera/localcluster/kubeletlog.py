"""How long each DRA call took on the kubelet's own clock, read from its log.

At ``--v=4`` the kubelet logs ``"Calling NodePrepareResources rpc"`` before it calls a DRA
plugin and ``"Done calling NodePrepareResources rpc"`` when the answer is in, each with the
driver's name and the request or response, whose claim UIDs pair the two lines. The kubelet's
histograms (``dra_operations_duration_seconds``, ``dra_grpc_operations_duration_seconds``)
cannot say the same: their buckets are ``ExponentialBucketsRange(0.1, 40, 15)``, so every call
under 100 ms falls in the first bucket and a p50 or p99 below that is a guess. The log's
timestamps are microseconds. (Kubelet 1.36 logs only the end of a NodeUnprepareResources call,
so of the two only prepare can be timed this way.)
Not for: starting the kubelet (``tessera.localcluster.nodes.RealNode``, ``kubelet_flags``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

# klog's text header: severity, mmdd hh:mm:ss.uuuuuu, thread id, file:line]
_HEADER_RE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6}\s")
_LINE_RE = re.compile(
    r"^[IWEF](?P<month>\d\d)(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d\.\d{6})\s+\d+\s+\S+\]\s+"
    r"\"(?P<what>Calling|Done calling) (?P<method>Node\w+Resources) rpc\"(?P<rest>.*)$"
)
_UID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class DraCall:
    """One DRA call as the kubelet logged it."""

    method: str  # NodePrepareResources | NodeUnprepareResources
    claims: frozenset[str]  # claim UIDs in the request
    seconds: float


def _stamp(match: re.Match[str]) -> float:
    # klog writes no year; a fixed leap year reads every mmdd (a run across New Year is not expected)
    when = datetime.strptime(f"2024{match['month']}{match['day']} {match['time']}", "%Y%m%d %H:%M:%S.%f")
    return when.timestamp()


def _entries(lines: Iterable[str]) -> Iterator[tuple[re.Match[str], str]]:
    """DRA call lines with their whole text: klog writes a multi-line value (``key=<`` ... ``>``)
    on the lines after its header, which carry no header of their own."""
    current: tuple[re.Match[str], list[str]] | None = None
    for line in lines:
        if _HEADER_RE.match(line):
            if current is not None:
                yield current[0], "".join(current[1])
            match = _LINE_RE.match(line.rstrip("\n"))
            current = (match, [match["rest"]]) if match is not None else None
        elif current is not None:
            current[1].append(line)
    if current is not None:
        yield current[0], "".join(current[1])


def dra_calls(lines: Iterable[str], driver: str, method: str = "NodePrepareResources") -> list[DraCall]:
    """The ``method`` calls to ``driver`` in a kubelet log, in the order they ended. A call is
    paired with its end by a claim UID both entries name, else (an entry that names none) with
    the oldest call still open; a call that never ended is left out."""
    open_calls: list[tuple[float, frozenset[str]]] = []
    calls: list[DraCall] = []
    driver_field = f'driverName="{driver}"'
    for match, text in _entries(lines):
        if match["method"] != method or driver_field not in text:
            continue
        stamp, uids = _stamp(match), frozenset(_UID_RE.findall(text))
        if match["what"] == "Calling":
            open_calls.append((stamp, uids))
            continue
        index = next((i for i, (_, asked) in enumerate(open_calls) if asked & uids), 0 if open_calls else None)
        if index is None:
            continue
        began, asked = open_calls.pop(index)
        calls.append(DraCall(method, asked, stamp - began))
    return calls


__all__ = ["DraCall", "dra_calls"]
