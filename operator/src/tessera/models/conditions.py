"""Status conditions with Kubernetes' conventions (metav1.Condition) and the one way to set them.

``set_condition`` keeps ``lastTransitionTime`` unless the status really changes, so a resync
that finds nothing new writes nothing new. The timestamps are RFC 3339 (``now_rfc3339`` and
``format_rfc3339`` write them, ``parse_rfc3339`` reads any the API sends). Not for: deciding what a condition says.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

from pydantic import Field

from tessera.models.base import KubeModel


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(KubeModel):
    """One entry of ``status.conditions``, as metav1.Condition defines it."""

    type: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9]*$", max_length=316)
    status: ConditionStatus
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32768)
    observed_generation: int | None = Field(default=None, ge=0)
    last_transition_time: str = Field(description="RFC 3339, when status last changed")


def format_rfc3339(moment: datetime) -> str:
    """``moment`` as Kubernetes writes a timestamp: UTC, whole seconds, ``Z``."""
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def now_rfc3339() -> str:
    return format_rfc3339(datetime.now(UTC))


def parse_rfc3339(text: object) -> datetime | None:
    """A Kubernetes timestamp (``2026-12-06T23:21:03Z``, a Lease's with microseconds too) as an
    aware datetime (UTC when it names no zone); None when it is missing or not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def set_condition(
    conditions: list[Condition] | tuple[Condition, ...],
    type_: str,
    status: ConditionStatus | bool,
    reason: str,
    message: str,
    observed_generation: int | None = None,
    now: str | None = None,
) -> list[Condition]:
    """A new list with ``type_`` set; the transition time moves only when the status changes."""
    if isinstance(status, bool):
        status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    out: list[Condition] = []
    found = False
    for c in conditions:
        if c.type != type_:
            out.append(c)
            continue
        found = True
        when = c.last_transition_time if c.status == status else (now or now_rfc3339())
        out.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                observed_generation=observed_generation,
                last_transition_time=when,
            )
        )
    if not found:
        out.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                observed_generation=observed_generation,
                last_transition_time=now or now_rfc3339(),
            )
        )
    return out


def find_condition(conditions: list[Condition] | tuple[Condition, ...], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
