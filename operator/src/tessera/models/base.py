"""The base of every Tessera model: camelCase on the wire, snake_case in Python.

Models are values: frozen, compared by content, serialised the way Kubernetes expects
(``to_kube``). Not for I/O: nothing here talks to the API or to GPUs.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class KubeModel(BaseModel):
    """A frozen pydantic model whose wire names are camelCase, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    def to_kube(self) -> dict[str, Any]:
        """The object as Kubernetes stores it: camelCase keys, no nulls."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    @classmethod
    def from_kube(cls, data: Any) -> Self:
        """Parse what the API returned (or a user wrote)."""
        return cls.model_validate(data if data is not None else {})
