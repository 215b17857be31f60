"""Metadata records on the log: one JSON object per record, a JSON array per snapshot.

Each record of :mod:`automq_ref.vocabulary.metadata_records` is written as
``{"type": "<RecordClass>", <field>: <value>, ...}``: integers, strings and booleans as
themselves, enums by value, ``bytes`` as hex strings, stream ranges as ``[stream, start, end]``
triples, listeners as ``[name, host, port]`` triples. JSON keeps the metadata log readable with
ordinary tools; the controller's records are small and few (one batch per request), so the
encoding's cost does not matter here. Decoding checks the type name, the field names and every
field's type, and raises :class:`~automq_ref.formats.errors.InvalidFieldError` for anything
else. A field added to a record later has a default, and a record written before it existed
(without the field) decodes with that default.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Final

from automq_ref.formats.errors import InvalidFieldError
from automq_ref.vocabulary import metadata_records as mr

RECORD_TYPES: Final[dict[str, type[Any]]] = {
    cls.__name__: cls for cls in mr.MetadataRecord.__args__
}
_ENUM_FIELDS: Final = {"state"}
_STRING_FIELDS: Final = {"key", "topic_id", "name", "rack", "wal_config"}
_BOOLEAN_FIELDS: Final = {"failover_mode", "fenced", "in_controlled_shutdown"}


def _encode_value(value: object) -> object:
    if isinstance(value, bool | int | str):
        return int(value) if isinstance(value, mr.StreamState | mr.S3ObjectState) else value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):
        return [_encode_item(item) for item in value]
    raise TypeError(f"cannot encode {type(value).__name__} in a metadata record")


def _encode_item(item: object) -> list[object]:
    if isinstance(item, mr.StreamOffsetRange):
        return [item.stream_id, item.start_offset, item.end_offset]
    if isinstance(item, mr.Endpoint):
        return [item.name, item.host, item.port]
    raise TypeError(f"cannot encode {type(item).__name__} in a metadata record")


def record_to_json(record: mr.MetadataRecord) -> dict[str, object]:
    encoded: dict[str, object] = {"type": type(record).__name__}
    for field in dataclasses.fields(record):
        encoded[field.name] = _encode_value(getattr(record, field.name))
    return encoded


def encode_record(record: mr.MetadataRecord) -> bytes:
    return json.dumps(record_to_json(record), separators=(",", ":")).encode()


def _decode_value(record_type: type[Any], name: str, value: object) -> object:
    if name in _ENUM_FIELDS:
        enum_type = mr.StreamState if record_type is mr.S3StreamRecord else mr.S3ObjectState
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidFieldError(f"{record_type.__name__}.{name} must be an integer")
        try:
            return enum_type(value)
        except ValueError as error:
            raise InvalidFieldError(f"{record_type.__name__}.{name}={value} unknown") from error
    if name == "ranges":
        if not isinstance(value, list) or not all(
            isinstance(item, list)
            and len(item) == 3
            and all(isinstance(n, int) and not isinstance(n, bool) for n in item)
            for item in value
        ):
            raise InvalidFieldError(f"{record_type.__name__}.ranges must be [[s, start, end]]")
        return tuple(mr.StreamOffsetRange(*item) for item in value)
    if name == "listeners":
        if not isinstance(value, list) or not all(
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and isinstance(item[1], str)
            and isinstance(item[2], int)
            and not isinstance(item[2], bool)
            for item in value
        ):
            raise InvalidFieldError(
                f"{record_type.__name__}.listeners must be [[name, host, port]]"
            )
        return tuple(mr.Endpoint(*item) for item in value)
    if name == "value":
        if not isinstance(value, str):
            raise InvalidFieldError(f"{record_type.__name__}.value must be a hex string")
        try:
            return bytes.fromhex(value)
        except ValueError as error:
            raise InvalidFieldError(f"{record_type.__name__}.value is not hex") from error
    if name in _STRING_FIELDS:
        if not isinstance(value, str):
            raise InvalidFieldError(f"{record_type.__name__}.{name} must be a string")
        return value
    if name in _BOOLEAN_FIELDS:
        if not isinstance(value, bool):
            raise InvalidFieldError(f"{record_type.__name__}.{name} must be a boolean")
        return value
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidFieldError(f"{record_type.__name__}.{name} must be an integer")
    return value


def record_from_json(encoded: object) -> mr.MetadataRecord:
    if not isinstance(encoded, dict):
        raise InvalidFieldError("a metadata record must be a JSON object")
    record_type = RECORD_TYPES.get(str(encoded.get("type")))
    if record_type is None:
        raise InvalidFieldError(f"unknown metadata record type {encoded.get('type')!r}")
    fields = dataclasses.fields(record_type)
    names = {field.name for field in fields}
    required = {field.name for field in fields if field.default is dataclasses.MISSING}
    given = set(encoded) - {"type"}
    if not required <= given <= names:
        raise InvalidFieldError(
            f"{record_type.__name__} fields {sorted(given)} differ from {sorted(names)}"
        )
    values = {name: _decode_value(record_type, name, encoded[name]) for name in given}
    record: mr.MetadataRecord = record_type(**values)
    return record


def decode_record(payload: bytes) -> mr.MetadataRecord:
    try:
        encoded = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidFieldError(f"metadata record is not JSON: {error}") from error
    return record_from_json(encoded)


def encode_snapshot(records: list[mr.MetadataRecord]) -> bytes:
    return json.dumps([record_to_json(record) for record in records]).encode()


def decode_snapshot(payload: bytes) -> list[mr.MetadataRecord]:
    try:
        encoded = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidFieldError(f"metadata snapshot is not JSON: {error}") from error
    if not isinstance(encoded, list):
        raise InvalidFieldError("a metadata snapshot must be a JSON array")
    return [record_from_json(item) for item in encoded]
