"""Requests decoded and small responses encoded with kio, plus a builder for kio's dataclasses.

kio (Kafka's message schemas as frozen dataclasses) decodes every request version a Kafka 4.0
broker accepts. Its response classes want phantom types (``ErrorCode``, ``i32Timedelta``, ...);
:func:`build` makes one from plain values (ints, lists of dicts), ignoring keys a version does
not have and leaving out ones it does not need, so one dict serves every version of a response.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import struct
import types
import typing
import uuid
from collections.abc import Mapping
from typing import Any, TypeVar

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32, i32Timedelta, i64Timedelta

from automq_ref.protocol.tagged_fields import strip_unknown_tagged_fields

E = TypeVar("E")


class RequestDecodeError(ValueError):
    """The request cannot be decoded (unknown key/version, truncated, garbage)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request, without decoding the rest."""
    if len(frame) < 8:
        raise RequestDecodeError(f"a request of {len(frame)} bytes has no header")
    api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame, 0)
    return api_key, api_version, correlation_id


@functools.lru_cache(maxsize=256)
def api_name(api_key: int) -> str:
    """Kafka's name for an API key (``AddPartitionsToTxn`` for 24), or ``an unknown API`` for a
    key Kafka does not define: for messages about requests this broker refuses."""
    for version in range(32):
        try:
            return str(load_request_schema(api_key, version).__name__).removesuffix("Request")
        except Exception:  # kio: an unknown key, or no such version of it
            continue
    return "an unknown API"


_READERS: dict[Any, Any] = {}
_WRITERS: dict[Any, Any] = {}
_HINTS: dict[Any, dict[str, Any]] = {}


def _reader(cls: Any) -> Any:
    reader = _READERS.get(cls)
    if reader is None:
        reader = _READERS[cls] = entity_reader(cls)
    return reader


def _writer(cls: Any) -> Any:
    writer = _WRITERS.get(cls)
    if writer is None:
        writer = _WRITERS[cls] = entity_writer(cls)
    return writer


_REQUEST_CLASSES: dict[tuple[int, int], type[Any]] = {}


def request_class(api_key: int, api_version: int) -> type[Any]:
    cls = _REQUEST_CLASSES.get((api_key, api_version))
    if cls is not None:
        return cls
    try:
        cls = typing.cast(type[Any], load_request_schema(api_key, api_version))
    except Exception as error:
        raise RequestDecodeError(f"api key {api_key} version {api_version}: {error}") from error
    _REQUEST_CLASSES[(api_key, api_version)] = cls
    return cls


def decode_request(frame: bytes) -> tuple[RequestHeader, Any]:
    """Header and body of a request frame (the bytes after the size prefix)."""
    api_key, api_version, _ = peek_header(frame)
    cls = request_class(api_key, api_version)
    try:
        return _decode(cls, frame)
    except KeyError as error:
        if "tagged field" not in str(error):
            raise RequestDecodeError(f"{cls.__name__} v{api_version}: {error}") from error
    # A client sent tagged fields this schema does not declare: they must be skipped.
    try:
        return _decode(cls, strip_unknown_tagged_fields(cls, frame))
    except Exception as error:
        raise RequestDecodeError(f"{cls.__name__} v{api_version}: {error}") from error


def _decode(cls: type[Any], frame: bytes) -> tuple[RequestHeader, Any]:
    try:
        header, offset = _reader(cls.__header_schema__)(frame, 0)
        body, _ = _reader(cls)(frame, offset)
    except KeyError:
        raise
    except Exception as error:
        raise RequestDecodeError(f"{cls.__name__}: {error}") from error
    # Bytes after the body are ignored, as Kafka's request parser ignores them (librdkafka
    # 2.16 sends three extra bytes after an all-topics Metadata v13 request).
    return (
        RequestHeader(
            int(header.request_api_key),
            int(header.request_api_version),
            int(header.correlation_id),
            header.client_id,
        ),
        body,
    )


class _Chunks(list[bytes | memoryview]):
    def write(self, chunk: bytes | memoryview) -> int:
        self.append(chunk)
        return len(chunk)


def encode_response(
    api_key: int, api_version: int, correlation_id: int, response: Any
) -> list[bytes | memoryview]:
    """Response header + body as chunks (no size prefix)."""
    cls = response_class(api_key, api_version)
    header_cls = cls.__header_schema__
    out = _Chunks()
    _writer(header_cls)(out, header_cls(correlation_id=i32(correlation_id)))
    _writer(cls)(out, response)
    return out


def encode_request(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: Any
) -> bytes:
    """A whole request frame (header and body, no size prefix): what a broker sends another."""
    cls = request_class(api_key, api_version)
    header_cls = cls.__header_schema__
    values = {
        "request_api_key": api_key,
        "request_api_version": api_version,
        "correlation_id": correlation_id,
        "client_id": client_id,
    }
    out = _Chunks()
    _writer(header_cls)(out, build(header_cls, values))
    _writer(cls)(out, body)
    return b"".join(out)


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, body) of a response frame (the bytes after the size prefix)."""
    cls = response_class(api_key, api_version)
    header, offset = _reader(cls.__header_schema__)(frame, 0)
    body, _ = _reader(cls)(frame, offset)
    return int(header.correlation_id), body


_RESPONSE_CLASSES: dict[tuple[int, int], type[Any]] = {}


def response_class(api_key: int, api_version: int) -> type[Any]:
    cls = _RESPONSE_CLASSES.get((api_key, api_version))
    if cls is None:  # kio resolves the schema module on every call: keep the answer
        cls = _RESPONSE_CLASSES[(api_key, api_version)] = typing.cast(
            type[Any], load_response_schema(api_key, api_version)
        )
    return cls


def _hints(cls: Any) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def build(cls: type[E], values: Mapping[str, Any]) -> E:
    """An instance of kio class ``cls`` from plain values; keys the class lacks are ignored."""
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.name not in values:
            continue
        kwargs[field.name] = _convert(hints[field.name], field, values[field.name])
    return cls(**kwargs)


def _convert(annotation: Any, field: dataclasses.Field[Any], value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        inner = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _convert(inner[0], field, value)
    if origin is tuple:
        item = typing.get_args(annotation)[0]
        return tuple(_convert(item, field, element) for element in value)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        return build(annotation, value)
    if annotation is ErrorCode:
        return value if isinstance(value, ErrorCode) else ErrorCode(int(value))
    if isinstance(annotation, type) and issubclass(annotation, i32Timedelta | i64Timedelta):
        if isinstance(value, datetime.timedelta):
            return value
        return datetime.timedelta(milliseconds=int(value))
    if annotation is uuid.UUID and not isinstance(value, uuid.UUID):
        return uuid.UUID(int=int(value)) if isinstance(value, int) else uuid.UUID(str(value))
    return value


def has_error_code(api_key: int, api_version: int) -> bool:
    """Whether the response of ``api_key`` at ``api_version`` has a top-level ``error_code``
    (False for a key or version kio does not know)."""
    try:
        cls = response_class(api_key, api_version)
    except Exception:  # kio: an unknown key, or no such version of it
        return False
    return any(field.name == "error_code" for field in dataclasses.fields(cls))


def encode_error_response(
    api_key: int, api_version: int, correlation_id: int, error_code: int
) -> list[bytes | memoryview]:
    """A response of ``api_key`` whose top-level ``error_code`` is ``error_code`` and whose
    other fields are empty (zero, empty strings and lists, null where allowed): Kafka's
    ``getErrorResponse`` for a request it does not serve. The response must have an
    ``error_code`` (:func:`has_error_code`)."""
    cls = response_class(api_key, api_version)
    values = {
        field.name: _empty(hint, field)
        for field, hint in ((f, _hints(cls)[f.name]) for f in dataclasses.fields(cls))
        if field.name != "error_code"
    }
    body = cls(error_code=ErrorCode(error_code), **values)
    return encode_response(api_key, api_version, correlation_id, body)


def _empty(annotation: Any, field: dataclasses.Field[Any] | None = None) -> Any:
    """The empty value of a field of ``annotation``: its default if it has one."""
    if field is not None and field.default is not dataclasses.MISSING:
        return field.default
    if field is not None and field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return None  # optional: null
    if origin is tuple:
        return ()
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        nested = _hints(annotation)
        return annotation(
            **{f.name: _empty(nested[f.name], f) for f in dataclasses.fields(annotation)}
        )
    if annotation is ErrorCode:
        return ErrorCode(0)
    if isinstance(annotation, type) and issubclass(annotation, i32Timedelta | i64Timedelta):
        return datetime.timedelta(0)
    if annotation is uuid.UUID:
        return uuid.UUID(int=0)
    if annotation is bool:
        return False
    if annotation is bytes:
        return b""
    if isinstance(annotation, type) and issubclass(annotation, datetime.datetime):
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    if isinstance(annotation, type) and issubclass(annotation, str):
        return annotation("")
    if isinstance(annotation, type) and issubclass(annotation, int):
        return annotation(0)
    if isinstance(annotation, type) and issubclass(annotation, float):
        return annotation(0.0)
    raise TypeError(f"no empty value for {annotation!r}")
