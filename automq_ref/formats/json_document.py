"""JSON documents as the small storage codecs write them, and the checks their decoders share.

The MetaStream records, topic records and offsets-stream records are compact JSON: readable with
ordinary tools, and small and rare enough that the encoding's cost does not matter. Their
decoders load the bytes here (any failure, including nesting too deep for the parser or an
integer too long to convert, becomes :class:`~automq_ref.formats.errors.InvalidFieldError`) and
check every field they use with the helpers below before trusting it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TypeAlias

from automq_ref.formats.errors import InvalidFieldError

Json: TypeAlias = bool | int | float | str | list["Json"] | dict[str, "Json"] | None


def encode_json(document: Json, *, sort_keys: bool = False) -> bytes:
    """``document`` as compact JSON (no spaces after separators)."""
    return json.dumps(document, separators=(",", ":"), sort_keys=sort_keys).encode()


def decode_json(payload: bytes | bytearray | memoryview, what: str) -> Json:
    """The JSON value in ``payload``; :class:`InvalidFieldError` if it is not one."""
    try:
        document: Json = json.loads(bytes(payload))
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError, ...
        raise InvalidFieldError(f"{what} is not JSON: {error}") from error
    return document


def require_object(value: Json, what: str) -> dict[str, Json]:
    if not isinstance(value, dict):
        raise InvalidFieldError(f"{what} must be a JSON object")
    return value


def require_list(value: Json, what: str, *, length: int | None = None) -> list[Json]:
    if not isinstance(value, list):
        raise InvalidFieldError(f"{what} must be a JSON array")
    if length is not None and len(value) != length:
        raise InvalidFieldError(f"{what} must hold {length} items, not {len(value)}")
    return value


def require_field(document: Mapping[str, Json], name: str, what: str) -> Json:
    if name not in document:
        raise InvalidFieldError(f"{what} has no field {name!r}")
    return document[name]


def require_int(value: Json, what: str, *, minimum: int | None = None) -> int:
    # bool is an int in Python, not in these formats.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidFieldError(f"{what} must be an integer")
    if minimum is not None and value < minimum:
        raise InvalidFieldError(f"{what}={value} is below {minimum}")
    return value


def require_str(value: Json, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidFieldError(f"{what} must be a string")
    return value
