"""The typed responses (``automq_ref/kafka/responses.py``) name only fields kio's classes have.

The conversion to kio drops a field that the request's version lacks (one response class serves
every version), so a misspelled field would be dropped silently; here every field of every
response, and of every entry nested in one, must exist in at least one version this broker
serves."""

from __future__ import annotations

import dataclasses
import sys
import typing
from typing import Any

from automq_ref.kafka import quotas, responses, sasl
from automq_ref.kafka.dispatch import ROUTES
from automq_ref.kafka.handlers import acls
from automq_ref.kafka.handlers import scram as scram_handlers
from automq_ref.kafka.request import ApiKey
from automq_ref.protocol.kio_codec import response_class

# The typed responses of responses.py, and of the modules that keep their own (sasl.py,
# quotas.py, handlers/acls.py, handlers/scram.py).
RESPONSES = [
    cls
    for module in (responses, sasl, quotas, acls, scram_handlers)
    for cls in vars(module).values()
    if isinstance(cls, type) and issubclass(cls, responses.Response)
    if cls is not responses.Response and cls.__module__ == module.__name__
]


def nested_class(annotation: Any) -> type | None:
    """The dataclass an annotation holds (directly, in a tuple or sequence, or optional)."""
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return annotation
    for argument in typing.get_args(annotation):
        found = nested_class(argument)
        if found is not None:
            return found
    return None


def check(ours: type, theirs: list[type], where: str) -> None:
    their_fields: dict[str, list[type]] = {}
    for cls in theirs:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            nested = nested_class(hints[field.name])
            their_fields.setdefault(field.name, [])
            if nested is not None:
                their_fields[field.name].append(nested)
    names = {**vars(responses), **vars(sys.modules[ours.__module__])}
    our_hints = typing.get_type_hints(ours, names)
    for field in dataclasses.fields(ours):
        assert field.name in their_fields, f"{where}.{field.name} is in no served version"
        our_nested = nested_class(our_hints[field.name])
        if our_nested is not None:
            assert their_fields[field.name], f"{where}.{field.name}: kio has no entries there"
            check(our_nested, their_fields[field.name], f"{where}.{field.name}")


def test_every_response_field_exists_in_a_served_version() -> None:
    # All but Produce, Fetch and AutomqGetPartitionSnapshot (encoded by hand).
    assert len(RESPONSES) == len(ROUTES) - 3
    for ours in RESPONSES:
        route = ROUTES[ours.API_KEY]  # the served range (telemetry is not advertised)
        low, high = route.min_version, route.max_version
        theirs = [response_class(ours.API_KEY, version) for version in range(low, high + 1)]
        check(ours, theirs, ours.__name__)


def test_one_response_class_per_api() -> None:
    keys = [cls.API_KEY for cls in RESPONSES]
    assert len(set(keys)) == len(keys)
    assert set(keys) == set(ROUTES) - {
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.AUTOMQ_GET_PARTITION_SNAPSHOT,
    }
