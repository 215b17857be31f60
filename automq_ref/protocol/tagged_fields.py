"""Drop the tagged fields a request's schema does not declare, so kio can decode the request.

KIP-482 gives every structure of a flexible message version a tagged-field section: an unsigned
varint count, then per field an unsigned varint tag, an unsigned varint size and that many bytes.
A receiver must skip the tags it does not know; that is what lets a newer client add an optional
field without a new API version. kio's native reader instead raises
``KeyError('Unknown tagged field tag: N')`` on the first unknown tag, so one new tagged field in a
client would make every request of that API undecodable.

Theory of operation
-------------------

The fix is a rewrite of the request bytes, not a second decoder. :func:`strip_unknown_tagged_fields`
walks the frame (request header, then body) along kio's own schema: the generated dataclass
fields in declaration order, with the wire type that kio keeps in each field's metadata, exactly
as kio's reader interprets them (legacy ``client_id`` in every request header, compact strings,
bytes and arrays in flexible versions, an int8 marker in front of a nullable struct, the tagged
fields of a struct after its regular fields). The walk only measures: fixed-width values and arrays
of them are skipped by arithmetic, variable ones by their length prefix, structs field by field.

Each tagged-field section met on the way is kept as it is when every tag in it is declared by the
struct's schema. Otherwise it is re-encoded: the unknown tags are dropped, the known ones are kept
in their order with their bytes, and the count is re-encoded. A known tag whose value holds a
struct (``FetchRequest.replica_state``) is walked too, since that struct has its own tagged
section; when it changes, the tag's size is re-encoded. Every known tag's value must take exactly
the bytes its size declares, because kio reads the value and ignores the size.

The rewritten sections are collected as edits (start, stop, replacement) in frame order and
spliced once at the end, so the cost is one walk plus one copy of the frame, and nothing at all is
copied when no section changed: the caller gets back the very object it passed in. A nested
rewrite copies only the bytes of the tag that holds it, once per nesting level, and the schemas
are a few levels deep, so the work stays linear in the frame.

The walk is meant for the slow path. The broker decodes with kio first and calls this module only
when kio raised the unknown-tag ``KeyError`` (:func:`is_unknown_tagged_field_error`);
:func:`decode_request` does both. Bytes that are not a valid encoding of the schema raise a
:class:`~automq_ref.protocol.primitives.MalformedRequestError` (a ``ValueError``) that names the
struct and field being read: :class:`~automq_ref.protocol.primitives.TruncatedRequestError` when
the frame ends early. Validation beyond sizes (UTF-8, value ranges) is left to kio, which decodes
the rewritten frame.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable
from typing import Any, Final, TypeAlias, TypeVar, cast

from kio.serial import entity_reader
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.static.protocol import Entity, RequestPayload

from automq_ref.protocol.primitives import (
    MalformedRequestError,
    TruncatedRequestError,
    encode_uvarint,
)

__all__ = [
    "decode_request",
    "is_unknown_tagged_field_error",
    "strip_unknown_entity_tags",
    "strip_unknown_tagged_fields",
]

_Data: TypeAlias = bytes | memoryview
_Edit: TypeAlias = tuple[int, int, bytes]
_Walk: TypeAlias = Callable[[_Data, int, int, list[_Edit]], int]
"""``walk(data, position, end, edits) -> position after the value``; appends the value's rewrites
to ``edits`` (absolute offsets, in order) and never reads at or past ``end``."""

FrameT = TypeVar("FrameT", bound=bytes | bytearray | memoryview)
EntityT = TypeVar("EntityT", bound=Entity)

UNKNOWN_TAG_MESSAGE_PREFIX: Final = "Unknown tagged field tag: "
"""How kio's native reader words the ``KeyError`` it raises on an undeclared tag."""

_FIXED_SIZES: Final = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_UVARINT_MAX_BYTES: Final = 5
_NULL_STRUCT_MARKER: Final = 0xFF  # int8 -1 in front of a null nullable struct (KIP-893)


@dataclasses.dataclass(frozen=True, slots=True)
class _Codec:
    """How to walk over one wire value; ``fixed_size`` when every value takes that many bytes."""

    walk: _Walk
    fixed_size: int | None


# --- public API ---------------------------------------------------------------------------------


class UnknownSchemaError(TypeError):
    """A kio schema shape the walker has no rule for (none of kio 0.6.5's request schemas:
    tests/unit/test_tagged_fields.py walks all of them); a newer kio could bring one."""


def strip_unknown_tagged_fields(request_cls: type[RequestPayload], frame: FrameT) -> FrameT | bytes:
    """``frame`` (request header then body, without the 4-byte size prefix) with every tagged
    field that ``request_cls``'s schema (or its header's) does not declare removed.

    Returns ``frame`` itself, not a copy, when no tagged-field section holds an unknown tag (always
    so for a request whose header and body are both non-flexible). Bytes after the body are kept as
    they are. Raises :class:`MalformedRequestError` (:class:`TruncatedRequestError` for a frame that
    ends early) when ``frame`` is not an encoding of the schema.
    """
    header_cls: type[Entity] = request_cls.__header_schema__
    if not (request_cls.__flexible__ or header_cls.__flexible__):
        return frame
    data = _as_data(frame)
    end = len(data)
    edits: list[_Edit] = []
    position = _entity_codec(header_cls, nullable=False).walk(data, 0, end, edits)
    _entity_codec(request_cls, nullable=False).walk(data, position, end, edits)
    if not edits:
        return frame
    return _splice(data, 0, end, edits)


def strip_unknown_entity_tags(
    entity_cls: type[Entity], buffer: FrameT, offset: int = 0
) -> FrameT | bytes:
    """``buffer`` with the unknown tagged fields removed from the one ``entity_cls`` value that
    starts at ``offset``; the bytes before ``offset`` and after the value are kept as they are.

    Same contract as :func:`strip_unknown_tagged_fields` (which is this, applied to the header and
    then to the body).
    """
    if not entity_cls.__flexible__:
        return buffer
    data = _as_data(buffer)
    end = len(data)
    if not 0 <= offset <= end:
        raise TruncatedRequestError(f"offset {offset} is outside a buffer of {end} bytes")
    edits: list[_Edit] = []
    _entity_codec(entity_cls, nullable=False).walk(data, offset, end, edits)
    if not edits:
        return buffer
    return _splice(data, 0, end, edits)


def is_unknown_tagged_field_error(error: BaseException) -> bool:
    """Whether ``error`` is kio's refusal of a tag its schema does not declare."""
    return (
        isinstance(error, KeyError)
        and len(error.args) == 1
        and isinstance(error.args[0], str)
        and error.args[0].startswith(UNKNOWN_TAG_MESSAGE_PREFIX)
    )


def decode_request(
    request_cls: type[EntityT], frame: bytes | bytearray | memoryview
) -> tuple[Entity, EntityT, int]:
    """Decode ``frame`` (header then body) with kio; if kio refuses an unknown tagged field, strip
    the unknown tags and decode again. Returns ``(header, body, bytes_read)``; ``bytes_read`` is
    the length of header and body in the frame that was decoded (the stripped one on the slow
    path), for a caller that wants to refuse trailing bytes.

    kio's own errors for other malformed input propagate unchanged; the strip step raises
    :class:`MalformedRequestError`.
    """
    header_cls: type[Entity] = cast(Any, request_cls).__header_schema__
    read_header = entity_reader(header_cls)
    read_body = entity_reader(request_cls)
    try:
        header, header_size = read_header(frame, 0)
        body, body_size = read_body(frame, header_size)
    except KeyError as error:
        if not is_unknown_tagged_field_error(error):
            raise
        stripped = strip_unknown_tagged_fields(cast(Any, request_cls), frame)
        header, header_size = read_header(stripped, 0)
        body, body_size = read_body(stripped, header_size)
    return header, body, header_size + body_size


# --- the walk -----------------------------------------------------------------------------------


def _as_data(frame: bytes | bytearray | memoryview) -> _Data:
    """Something to index (an int per byte) and slice without copying the frame."""
    if isinstance(frame, bytes):
        return frame
    view = memoryview(frame)
    if view.format != "B" or view.ndim != 1:
        if not view.c_contiguous:
            raise MalformedRequestError("request frame is not a contiguous buffer")
        view = view.cast("B")
    return view


def _splice(data: _Data, start: int, stop: int, edits: list[_Edit]) -> bytes:
    """``data[start:stop]`` with each ``(edit_start, edit_stop, replacement)`` applied; the edits
    are in order, disjoint and inside the range."""
    pieces: list[bytes | memoryview] = []
    cursor = start
    for edit_start, edit_stop, replacement in edits:
        pieces.append(data[cursor:edit_start])
        pieces.append(replacement)
        cursor = edit_stop
    pieces.append(data[cursor:stop])
    return b"".join(pieces)


def _truncated(what: str, position: int, size: int, end: int) -> TruncatedRequestError:
    return TruncatedRequestError(
        f"{what}: needs {size} bytes at offset {position}, only {end - position} left"
    )


def _skip(position: int, size: int, end: int, what: str) -> int:
    stop = position + size
    if stop > end:
        raise _truncated(what, position, size, end)
    return stop


def _read_uvarint(data: _Data, position: int, end: int, what: str) -> tuple[int, int]:
    """Kafka's unsigned varint (at most 5 bytes, below 2**32) at ``position``; (value, after)."""
    if position < end and data[position] < 0x80:
        return data[position], position + 1  # the usual case: one byte
    value = 0
    for index in range(_UVARINT_MAX_BYTES):
        if position + index >= end:
            raise TruncatedRequestError(
                f"{what}: the bytes end inside an unsigned varint at offset {position}"
            )
        byte = data[position + index]
        value |= (byte & 0x7F) << (7 * index)
        if byte < 0x80:
            if value >= 2**32:
                raise MalformedRequestError(
                    f"{what}: unsigned varint {value} at offset {position} exceeds 32 bits"
                )
            return value, position + index + 1
    raise MalformedRequestError(
        f"{what}: unsigned varint at offset {position} is longer than {_UVARINT_MAX_BYTES} bytes"
    )


def _unexpected_null(what: str, position: int) -> MalformedRequestError:
    return MalformedRequestError(f"{what}: null at offset {position} where none is allowed")


def _fixed(size: int, what: str) -> _Codec:
    def walk(data: _Data, position: int, end: int, edits: list[_Edit]) -> int:
        stop = position + size
        if stop > end:
            raise _truncated(what, position, size, end)
        return stop

    return _Codec(walk, size)


def _compact_bytes(nullable: bool, what: str) -> _Codec:
    """COMPACT_STRING / COMPACT_BYTES / COMPACT_RECORDS: unsigned varint length + 1, 0 = null."""

    def walk(data: _Data, position: int, end: int, edits: list[_Edit]) -> int:
        length_plus_one, after = _read_uvarint(data, position, end, what)
        if length_plus_one == 0:
            if not nullable:
                raise _unexpected_null(what, position)
            return after
        return _skip(after, length_plus_one - 1, end, what)

    return _Codec(walk, None)


def _legacy_bytes(length_format: struct.Struct, nullable: bool, what: str) -> _Codec:
    """STRING (int16 length) / BYTES, RECORDS (int32 length); -1 = null."""
    prefix_size = length_format.size

    def walk(data: _Data, position: int, end: int, edits: list[_Edit]) -> int:
        after = _skip(position, prefix_size, end, what)
        length: int = length_format.unpack_from(data, position)[0]
        if length < 0:
            if length != -1:
                raise MalformedRequestError(f"{what}: negative length {length} at {position}")
            if not nullable:
                raise _unexpected_null(what, position)
            return after
        return _skip(after, length, end, what)

    return _Codec(walk, None)


def _array(element: _Codec, flexible: bool, what: str) -> _Codec:
    """ARRAY (int32 count, -1 = null) / COMPACT_ARRAY (unsigned varint count + 1, 0 = null).
    kio reads a null array wherever one appears, so null is accepted here too."""

    def read_count(data: _Data, position: int, end: int) -> tuple[int, int]:
        if flexible:
            count_plus_one, after = _read_uvarint(data, position, end, what)
            return count_plus_one - 1, after
        after = _skip(position, 4, end, what)
        count: int = _INT32.unpack_from(data, position)[0]
        if count < -1:
            raise MalformedRequestError(f"{what}: negative array length {count} at {position}")
        return count, after

    element_size = element.fixed_size
    if element_size is not None:

        def walk_fixed(data: _Data, position: int, end: int, edits: list[_Edit]) -> int:
            count, after = read_count(data, position, end)
            return after if count <= 0 else _skip(after, count * element_size, end, what)

        return _Codec(walk_fixed, None)

    walk_element = element.walk

    def walk(data: _Data, position: int, end: int, edits: list[_Edit]) -> int:
        count, position = read_count(data, position, end)
        if count > end - position:  # every variable-size element takes at least one byte
            raise TruncatedRequestError(
                f"{what}: {count} elements cannot fit in the {end - position} bytes left"
            )
        for _ in range(count):
            position = walk_element(data, position, end, edits)
        return position

    return _Codec(walk, None)


def _primitive(kafka_type: str, flexible: bool, nullable: bool, what: str) -> _Codec:
    size = _FIXED_SIZES.get(kafka_type)
    if size is not None:
        return _fixed(size, what)
    if kafka_type in ("string", "bytes", "records"):
        if flexible:
            return _compact_bytes(nullable, what)
        return _legacy_bytes(_INT16 if kafka_type == "string" else _INT32, nullable, what)
    raise UnknownSchemaError(f"{what}: no walker for kafka_type {kafka_type!r}")


def _field_codec(
    entity_cls: type[Entity], field: dataclasses.Field[Any], *, tagged: bool
) -> _Codec:
    """The codec kio's reader uses for ``field`` (the rules of its ``build_field_schema``)."""
    what = f"{entity_cls.__name__}.{field.name}"
    flexible = entity_cls.__flexible__
    if entity_cls.__name__ == "RequestHeader" and field.name == "client_id":
        # Kafka keeps the header's client id a legacy nullable string in every header version.
        return _legacy_bytes(_INT16, True, what)
    match classify_field(field):
        case PrimitiveField():
            nullable = is_optional(field) and not tagged
            return _primitive(get_schema_field_type(field), flexible, nullable, what)
        case PrimitiveTupleField():
            element = _primitive(get_schema_field_type(field), flexible, False, what)
            return _array(element, flexible, what)
        case EntityField(type_=nested_cls):
            return _entity_codec(nested_cls, nullable=is_optional(field))
        case EntityTupleField(type_=nested_cls):
            return _array(_entity_codec(nested_cls, nullable=False), flexible, what)
    raise UnknownSchemaError(f"{what}: unsupported field {field!r}")  # pragma: no cover


@functools.cache
def _entity_codec(entity_cls: type[Entity], *, nullable: bool) -> _Codec:
    """The walk over one struct: an int8 null marker if ``nullable``, its regular fields in
    order, then (flexible versions) its tagged-field section."""
    name = entity_cls.__name__
    flexible = entity_cls.__flexible__
    regular: list[_Codec] = []
    known_tags: dict[int, tuple[str, _Walk]] = {}
    for field in dataclasses.fields(entity_cls):
        tag = get_field_tag(field)
        codec = _field_codec(entity_cls, field, tagged=tag is not None)
        if tag is None:
            regular.append(codec)
        else:
            known_tags[int(tag)] = (f"{name}.{field.name} (tag {tag})", codec.walk)
    if known_tags and not flexible:
        raise UnknownSchemaError(f"{name}: tagged fields in a non-flexible version")

    sizes = [codec.fixed_size for codec in regular]
    if not flexible and not nullable and None not in sizes:
        return _fixed(sum(cast(list[int], sizes)), name)

    walks = tuple(codec.walk for codec in regular)
    walk_section = _tagged_section(name, known_tags) if flexible else None
    marker_what = f"{name} null marker"

    def walk(data: _Data, position: int, end: int, edits: list[_Edit]) -> int:
        if nullable:
            after = _skip(position, 1, end, marker_what)
            if data[position] == _NULL_STRUCT_MARKER:
                return after
            position = after
        for walk_field in walks:
            position = walk_field(data, position, end, edits)
        if walk_section is not None:
            position = walk_section(data, position, end, edits)
        return position

    return _Codec(walk, None)


def _tagged_section(name: str, known_tags: dict[int, tuple[str, _Walk]]) -> _Walk:
    """The walk over a struct's tagged-field section, which it re-encodes (one edit) when the
    section holds an unknown tag or a known tag whose struct value was rewritten."""
    what = f"{name} tagged fields"

    def walk(data: _Data, position: int, end: int, edits: list[_Edit]) -> int:
        section_start = position
        count, position = _read_uvarint(data, position, end, f"{what} count")
        if count == 0:
            return position
        if count > (end - position) // 2:  # each tagged field takes at least two bytes
            raise TruncatedRequestError(
                f"{what}: {count} fields cannot fit in the {end - position} bytes left"
            )
        kept: list[tuple[int, int, int, list[_Edit]]] = []
        changed = False
        for _ in range(count):
            tag, position = _read_uvarint(data, position, end, f"{what} tag")
            size, position = _read_uvarint(data, position, end, f"{what} tag {tag} size")
            value_end = _skip(position, size, end, f"{what} tag {tag} value")
            known = known_tags.get(tag)
            if known is None:
                changed = True
            else:
                field_what, walk_value = known
                value_edits: list[_Edit] = []
                stop = walk_value(data, position, value_end, value_edits)
                if stop != value_end:
                    raise MalformedRequestError(
                        f"{field_what}: the value at offset {position} takes {stop - position} "
                        f"bytes but its tagged field size says {size}"
                    )
                changed = changed or bool(value_edits)
                kept.append((tag, position, value_end, value_edits))
            position = value_end
        if changed:
            pieces: list[bytes | memoryview] = [encode_uvarint(len(kept))]
            for tag, value_start, value_stop, value_edits in kept:
                value: bytes | memoryview = (
                    _splice(data, value_start, value_stop, value_edits)
                    if value_edits
                    else data[value_start:value_stop]
                )
                pieces += (encode_uvarint(tag), encode_uvarint(len(value)), value)
            edits.append((section_start, position, b"".join(pieces)))
        return position

    return walk
