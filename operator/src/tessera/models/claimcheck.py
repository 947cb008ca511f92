"""The operator's answer to an agent's claim check: which claims hold which of the node's
devices, as the operator's ordered watch of every claim had them when the ask came by.

The agent asks by writing a token on its fence claim (``tessera.kube.claims.ASK_ANNOTATION``);
the operator answers on the same claim (``ANSWER_ANNOTATION``) with this JSON::

    {"token": "<the token asked>", "node": "<node>", "claims": {"<namespace>/<name>": ["<device>", ...]}}

``claims`` names every claim whose allocation holds a device of Tessera's driver in the node's
pool (what ``tessera.models.allocation`` says a claim holds: admin access holds nothing), and
only those devices. ``as_claims`` turns it back into claim bodies of that shape, so the agent's
guard reads an answer as it reads a list of claims.
Not for: asking or answering (``tessera.agent.claimview``, ``tessera.controller.claimchecks``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class AnswerError(ValueError):
    """An answer that is not the JSON this module writes."""


@dataclass(frozen=True, slots=True)
class ClaimCheckAnswer:
    token: str
    node: str
    claims: Mapping[str, tuple[str, ...]]  # "<namespace>/<name>" -> devices held on the node

    def encode(self) -> str:
        return json.dumps({"token": self.token, "node": self.node,
                           "claims": {key: list(devices) for key, devices in sorted(self.claims.items())}},
                          separators=(",", ":"))

    @classmethod
    def of(cls, token: str, node: str, held: Iterable[tuple[str, Iterable[str]]]) -> ClaimCheckAnswer:
        """From (claim key, devices on ``node``) pairs; claims holding nothing there are left out."""
        claims = {key: tuple(sorted(devices)) for key, devices in held}
        return cls(token, node, {key: devices for key, devices in claims.items() if devices})

    @classmethod
    def decode(cls, text: str) -> ClaimCheckAnswer:
        try:
            raw = json.loads(text)
            claims = raw["claims"]
            if not isinstance(claims, dict) or not all(
                isinstance(devices, list) and all(isinstance(d, str) for d in devices) for devices in claims.values()
            ):
                raise TypeError("claims must map claim keys to lists of device names")
            return cls(str(raw["token"]), str(raw["node"]),
                       {str(key): tuple(devices) for key, devices in claims.items()})
        except (ValueError, KeyError, TypeError) as error:
            raise AnswerError(f"not a claim check answer: {error}") from None

    def as_claims(self, driver: str) -> list[dict[str, Any]]:
        """One claim body per claim, allocated exactly the devices the answer names."""
        out = []
        for key, devices in self.claims.items():
            namespace, _, name = key.partition("/")
            results = [{"driver": driver, "pool": self.node, "device": d, "request": "held"} for d in devices]
            out.append({"metadata": {"namespace": namespace, "name": name},
                        "status": {"allocation": {"devices": {"results": results}}}})
        return out
