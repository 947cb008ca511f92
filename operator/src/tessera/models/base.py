"""The base of every Tessera model: camelCase on the wire, snake_case in Python.

Models are values: frozen, compared by content, serialised the way Kubernetes expects
(``to_kube``). Not for I/O: nothing here talks to the API or to GPUs.
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

# One set of field names per distinct set: see KubeModel.model_post_init.
_FIELDS_SETS: dict[frozenset[str], set[str]] = {}


class KubeModel(BaseModel):
    """A frozen pydantic model whose wire names are camelCase, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
        # A model's validator and serializer are built when it is first used, not at import:
        # the agent imports the policy models with the layout's but never validates a policy,
        # and saves their build (~0.7 MiB resident on every GPU node).
        defer_build=True,
    )

    # String fields whose values repeat across a fleet (a model lists them): interned when parsed.
    _interned_fields: ClassVar[tuple[str, ...]] = ()

    def model_post_init(self, context: Any, /) -> None:
        """Share the set of field names given with every instance given the same ones.

        Pydantic keeps, per instance, a set of the fields its input named: 44 of the 71 KiB that
        a parsed NodeLayout of eight MIG GPUs takes, and the operator holds one per node. Models
        are frozen, so that set is never changed in place (``model_copy`` copies it first)."""
        fields = self.__pydantic_fields_set__
        object.__setattr__(self, "__pydantic_fields_set__", _FIELDS_SETS.setdefault(frozenset(fields), fields))
        # Strings that repeat across GPUs and nodes (product names, versions, profiles, PCI
        # addresses): one copy each. A frozen model's value is only swapped for an equal one.
        values = self.__dict__
        for name in self._interned_fields:
            if type(value := values[name]) is str:
                values[name] = sys.intern(value)

    def to_kube(self) -> dict[str, Any]:
        """The object as Kubernetes stores it: camelCase keys, no nulls."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    @classmethod
    def from_kube(cls, data: Any) -> Self:
        """Parse what the API returned (or a user wrote)."""
        return cls.model_validate(data if data is not None else {})
