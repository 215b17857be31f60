"""Unknown tagged fields (KIP-482) are stripped from request frames so that kio can decode them.

The oracle is kio. Frames are written by an encoder in this file that follows kio's writer field
by field (it calls kio's own primitive writers) and can add undeclared tags, with random numbers
and payloads, to any tagged-field section it writes: the header's, the body's, those of nested
structs and those inside a known tagged field's struct value. Without injected tags its output
must equal kio's; with them kio must refuse the frame, and after stripping the frame must be
byte for byte kio's encoding again and decode to the original value.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import random
import struct
import uuid
from collections.abc import Callable
from types import NoneType, UnionType
from typing import Any, get_args, get_origin

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.schema.fetch.v16.request import FetchRequest, ReplicaState
from kio.schema.index import api_key_map, schema_name_map
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_reader, entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
)
from kio.serial._serialize import get_field_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i32Timedelta, i64

from automq_ref.protocol.primitives import (
    MalformedRequestError,
    TruncatedRequestError,
    encode_uvarint,
)
from automq_ref.protocol.tagged_fields import (
    decode_request,
    is_unknown_tagged_field_error,
    strip_unknown_entity_tags,
    strip_unknown_tagged_fields,
)

ALL_REQUESTS: list[tuple[int, int]] = sorted(
    (api_key, version)
    for api_key, name in api_key_map.items()
    for version, types in schema_name_map[name].items()
    if EntityType.request in types
)
FLEXIBLE = [key for key in ALL_REQUESTS if load_request_schema(*key).__flexible__]
NON_FLEXIBLE = [key for key in ALL_REQUESTS if not load_request_schema(*key).__flexible__]

# (struct class name, tags the schema declares for it) -> undeclared (tag, payload) to add
Injector = Callable[[str, frozenset[int]], list[tuple[int, bytes]]]


def no_injection(name: str, known: frozenset[int]) -> list[tuple[int, bytes]]:
    return []


# --- values -------------------------------------------------------------------------------------

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}
_ALPHABET = "abcxyz-_.é€"


def random_primitive(kafka_type: str, rng: random.Random) -> object:
    if kafka_type in _INT_RANGES:
        return rng.randint(*_INT_RANGES[kafka_type])
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "float64":
        return rng.uniform(-1e9, 1e9)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=rng.randint(0, 2**31 - 1))
    if kafka_type == "uuid":
        return uuid.UUID(int=rng.getrandbits(128) | 1)  # the zero uuid reads back as None
    length = rng.choice((0, 1, 3, 7, 100, 130))  # 130: a compact length that needs two bytes
    if kafka_type == "string":
        return "".join(rng.choice(_ALPHABET) for _ in range(length))
    if kafka_type in ("bytes", "records"):
        return rng.randbytes(length)
    raise ValueError(f"no generator for kafka_type {kafka_type!r}")


def nullable_at_top(field: dataclasses.Field[Any]) -> bool:
    """Whether the field itself may hold None (not its array elements)."""
    return get_origin(field.type) in (UnionType,) and NoneType in get_args(field.type)


def random_entity(cls: type[Any], rng: random.Random, *, rich: bool) -> Any:
    """A value of ``cls``; ``rich`` sets every optional and tagged field and fills every array."""
    values: dict[str, object] = {}
    for field in dataclasses.fields(cls):
        tagged = get_field_tag(field) is not None
        if tagged and not rich and rng.random() < 0.5:
            values[field.name] = get_tagged_field_default(field)
            continue
        if nullable_at_top(field) and not tagged and not rich and rng.random() < 0.25:
            values[field.name] = None
            continue
        match classify_field(field):
            case PrimitiveField():
                values[field.name] = random_primitive(get_schema_field_type(field), rng)
            case PrimitiveTupleField():
                kafka_type = get_schema_field_type(field)
                count = rng.randint(1, 2) if rich else rng.randint(0, 2)
                values[field.name] = tuple(random_primitive(kafka_type, rng) for _ in range(count))
            case EntityField(type_=nested):
                values[field.name] = random_entity(nested, rng, rich=rich)
            case EntityTupleField(type_=nested):
                count = rng.randint(1, 2) if rich else rng.randint(0, 2)
                values[field.name] = tuple(
                    random_entity(nested, rng, rich=rich) for _ in range(count)
                )
    return cls(**values)


def random_header(request_cls: type[Any], rng: random.Random) -> Any:
    header_cls = request_cls.__header_schema__
    return header_cls(
        request_api_key=request_cls.__api_key__,
        request_api_version=request_cls.__version__,
        correlation_id=rng.randint(-(2**31), 2**31 - 1),
        client_id=rng.choice((None, "", "client-1", "ç" * 70)),
    )


# --- an encoder that follows kio's writer and can add tags --------------------------------------


def kio_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    writer: Any = entity_writer(type(value))
    writer(buffer, value)
    return buffer.getvalue()


def encode_entity(cls: type[Any], value: Any, inject: Injector) -> bytes:
    buffer = io.BytesIO()
    write_entity(buffer, cls, value, inject)
    return buffer.getvalue()


def write_entity(buffer: io.BytesIO, cls: type[Any], value: Any, inject: Injector) -> None:
    is_header = cls.__name__ == "RequestHeader"
    tagged: list[tuple[int, dataclasses.Field[Any]]] = []
    for field in dataclasses.fields(cls):
        field_tag = get_field_tag(field)
        if field_tag is None:
            write_field(buffer, cls, field, getattr(value, field.name), inject, is_header, False)
        else:
            tagged.append((int(field_tag), field))
    if not cls.__flexible__:
        return
    entries: list[tuple[int, bytes]] = []
    for tag, field in tagged:
        field_value = getattr(value, field.name)
        if field_value == field.default or (
            field.default is dataclasses.MISSING and field_value == get_tagged_field_default(field)
        ):
            continue  # kio leaves default-valued tagged fields out
        payload = io.BytesIO()
        write_field(payload, cls, field, field_value, inject, is_header, True)
        entries.append((tag, payload.getvalue()))
    known = frozenset(tag for tag, _ in tagged)
    extra = inject(cls.__name__, known)
    assert not known & {tag for tag, _ in extra}
    # KIP-482 wants tags in ascending order; kio writes its known ones that way.
    entries = sorted(entries + extra, key=lambda entry: entry[0])
    buffer.write(encode_uvarint(len(entries)))
    for tag, payload_bytes in entries:
        buffer.write(encode_uvarint(tag) + encode_uvarint(len(payload_bytes)) + payload_bytes)


def write_field(
    buffer: io.BytesIO,
    cls: type[Any],
    field: dataclasses.Field[Any],
    value: Any,
    inject: Injector,
    is_header: bool,
    is_tag: bool,
) -> None:
    flexible = cls.__flexible__
    match classify_field(field):
        case PrimitiveField() | PrimitiveTupleField():
            writer: Any = get_field_writer(field, flexible, is_header, is_tag)
            writer(buffer, value)
        case EntityField(type_=nested):
            if nullable_at_top(field) and not is_tag:
                if value is None:
                    buffer.write(b"\xff")
                    return
                buffer.write(b"\x01")
            write_entity(buffer, nested, value, inject)
        case EntityTupleField(type_=nested):
            if value is None:
                buffer.write(b"\x00" if flexible else struct.pack(">i", -1))
                return
            buffer.write(
                encode_uvarint(len(value) + 1) if flexible else struct.pack(">i", len(value))
            )
            for item in value:
                write_entity(buffer, nested, item, inject)


def random_injector(rng: random.Random, probability: float) -> Injector:
    """Adds one to three undeclared tags to a section with the given probability; tag numbers
    small and large (multi-byte varints), payloads empty, short, and longer than 127 bytes."""

    def inject(name: str, known: frozenset[int]) -> list[tuple[int, bytes]]:
        if rng.random() >= probability:
            return []
        tags: set[int] = set()
        while len(tags) < rng.randint(1, 3):
            tag = rng.choice(
                (rng.randint(0, 12), rng.randint(0, 127), rng.randint(128, 20_000), 2**31 - 1)
            )
            if tag not in known:
                tags.add(tag)
        return [(tag, rng.randbytes(rng.choice((0, 1, 5, 100, 200)))) for tag in tags]

    return inject


class CountingInjector:
    """Wraps an injector and counts the tags it added."""

    def __init__(self, inner: Injector) -> None:
        self.inner = inner
        self.injected = 0

    def __call__(self, name: str, known: frozenset[int]) -> list[tuple[int, bytes]]:
        extra = self.inner(name, known)
        self.injected += len(extra)
        return extra


def check_strip_restores(
    request_cls: type[Any], header: Any, body: Any, inject: CountingInjector
) -> None:
    canonical = kio_bytes(header) + kio_bytes(body)
    frame = encode_entity(type(header), header, inject) + encode_entity(request_cls, body, inject)
    read_header: Any = entity_reader(type(header))
    read_body: Any = entity_reader(request_cls)
    if inject.injected == 0:
        assert frame == canonical
        assert strip_unknown_tagged_fields(request_cls, frame) is frame
        return
    assert frame != canonical
    with pytest.raises(KeyError, match="Unknown tagged field tag") as refused:
        header_size = read_header(frame, 0)[1]
        read_body(frame, header_size)
    assert is_unknown_tagged_field_error(refused.value)
    stripped = strip_unknown_tagged_fields(request_cls, frame)
    assert stripped == canonical
    header_read, header_size = read_header(stripped, 0)
    body_read, body_size = read_body(stripped, header_size)
    assert (header_read, body_read) == (header, body)
    assert header_size + body_size == len(stripped)
    assert decode_request(request_cls, frame) == (header, body, len(stripped))


# --- the encoder is kio's writer ----------------------------------------------------------------


@pytest.mark.parametrize("key", ALL_REQUESTS, ids=lambda key: f"{key[0]}v{key[1]}")
def test_encoder_without_injection_matches_kio(key: tuple[int, int]) -> None:
    request_cls: Any = load_request_schema(*key)
    rng = random.Random(key[0] * 1000 + key[1])
    for rich in (True, False):
        body = random_entity(request_cls, rng, rich=rich)
        header = random_header(request_cls, rng)
        assert encode_entity(request_cls, body, no_injection) == kio_bytes(body)
        assert encode_entity(type(header), header, no_injection) == kio_bytes(header)


# --- unknown tags are stripped ------------------------------------------------------------------


@pytest.mark.parametrize("key", FLEXIBLE, ids=lambda key: f"{key[0]}v{key[1]}")
def test_unknown_tags_in_every_section_are_stripped(key: tuple[int, int]) -> None:
    """Every tagged section of a value with all arrays filled and all tagged fields set."""
    request_cls: Any = load_request_schema(*key)
    rng = random.Random(key[0] * 1000 + key[1])
    body = random_entity(request_cls, rng, rich=True)
    header = random_header(request_cls, rng)
    inject = CountingInjector(random_injector(rng, probability=1.0))
    check_strip_restores(request_cls, header, body, inject)
    assert inject.injected > 0
    # Only in nested structs: the top-level sections are rewritten only if a known tagged field
    # holds a struct that was.
    everywhere = random_injector(rng, probability=1.0)
    top_level = {request_cls.__name__, "RequestHeader"}
    nested_only = CountingInjector(
        lambda name, known: [] if name in top_level else everywhere(name, known)
    )
    check_strip_restores(request_cls, header, body, nested_only)


@given(st.sampled_from(FLEXIBLE), st.randoms(use_true_random=False), st.floats(0.0, 1.0))
def test_random_unknown_tags_are_stripped(
    key: tuple[int, int], rng: random.Random, probability: float
) -> None:
    request_cls: Any = load_request_schema(*key)
    body = random_entity(request_cls, rng, rich=False)
    header = random_header(request_cls, rng)
    check_strip_restores(
        request_cls, header, body, CountingInjector(random_injector(rng, probability))
    )


@pytest.mark.parametrize("key", NON_FLEXIBLE, ids=lambda key: f"{key[0]}v{key[1]}")
def test_non_flexible_versions_pass_through(key: tuple[int, int]) -> None:
    request_cls: Any = load_request_schema(*key)
    rng = random.Random(key[0] * 1000 + key[1])
    header = random_header(request_cls, rng)
    frame = kio_bytes(header) + kio_bytes(random_entity(request_cls, rng, rich=True))
    assert strip_unknown_tagged_fields(request_cls, frame) is frame
    garbage = b"\xff" * 3
    assert strip_unknown_tagged_fields(request_cls, garbage) is garbage  # not even walked


# --- a real case: MetadataRequest v12 with tag 99 -----------------------------------------------

METADATA_HEADER = RequestHeader(
    request_api_key=i16(3), request_api_version=i16(12), correlation_id=i32(7), client_id="console"
)
METADATA_BODY = MetadataRequest(
    topics=(MetadataRequestTopic(topic_id=None, name=TopicName("orders")),),
    allow_auto_topic_creation=False,
    include_topic_authorized_operations=True,
)


def metadata_frame_with_tag_99() -> bytes:
    header = (
        struct.pack(">hhih", 3, 12, 7, 7) + b"console" + b"\x00"  # header v2, no tagged fields
    )
    body = (
        b"\x02"  # compact array: one topic
        + b"\x00" * 16  # topic_id: null (the zero uuid)
        + b"\x07orders"  # compact string
        + b"\x00"  # the topic's tagged fields: none
        + b"\x00"  # allow_auto_topic_creation
        + b"\x01"  # include_topic_authorized_operations
        + b"\x01"  # one tagged field ...
        + b"\x63\x03abc"  # ... tag 99, three bytes: unknown to v12
    )
    return header + body


def test_metadata_v12_with_tag_99() -> None:
    frame = metadata_frame_with_tag_99()
    header_size = len(kio_bytes(METADATA_HEADER))
    with pytest.raises(KeyError) as refused:
        entity_reader(MetadataRequest)(frame, header_size)
    assert refused.value.args == ("Unknown tagged field tag: 99",)
    stripped = strip_unknown_tagged_fields(MetadataRequest, frame)
    assert stripped == kio_bytes(METADATA_HEADER) + kio_bytes(METADATA_BODY)
    assert decode_request(MetadataRequest, frame) == (METADATA_HEADER, METADATA_BODY, len(stripped))
    # The same frame in other buffer types; an unchanged one comes back as the same object.
    assert strip_unknown_tagged_fields(MetadataRequest, bytearray(frame)) == stripped
    assert strip_unknown_tagged_fields(MetadataRequest, memoryview(frame)) == stripped
    view = memoryview(stripped)
    assert strip_unknown_tagged_fields(MetadataRequest, view) is view


def test_header_tags_are_stripped() -> None:
    """Request header v2 declares no tagged field, so every tag in its section goes."""
    header = kio_bytes(METADATA_HEADER)
    frame = header[:-1] + b"\x02" + b"\x00\x01\xaa" + b"\x80\x01\x00" + kio_bytes(METADATA_BODY)
    with pytest.raises(KeyError, match="Unknown tagged field tag: 0"):
        entity_reader(RequestHeader)(frame, 0)
    assert strip_unknown_tagged_fields(MetadataRequest, frame) == header + kio_bytes(METADATA_BODY)


def test_unchanged_frame_is_returned_as_is() -> None:
    frame = kio_bytes(METADATA_HEADER) + kio_bytes(METADATA_BODY)
    assert strip_unknown_tagged_fields(MetadataRequest, frame) is frame
    assert decode_request(MetadataRequest, frame) == (METADATA_HEADER, METADATA_BODY, len(frame))


# --- known tagged fields are kept ---------------------------------------------------------------

FETCH_BODY = FetchRequest(
    cluster_id="cluster-a",
    replica_state=ReplicaState(replica_id=BrokerId(3), replica_epoch=i64(9)),
    max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=500)),
    min_bytes=i32(1),
    topics=(),
    forgotten_topics_data=(),
)


def test_known_tags_are_kept_and_nested_unknown_tags_stripped() -> None:
    """FetchRequest v16 declares tag 0 (cluster_id) and tag 1 (replica_state, a struct with its
    own tagged section). Unknown tags around them and inside replica_state are dropped, the known
    ones kept, and replica_state's size re-encoded."""

    def inject(name: str, known: frozenset[int]) -> list[tuple[int, bytes]]:
        if name == "FetchRequest":
            return [(2, b"new"), (300, b"")]
        if name == "ReplicaState":
            return [(0, b"x" * 200)]
        return []

    frame = encode_entity(FetchRequest, FETCH_BODY, inject)
    with pytest.raises(KeyError, match="Unknown tagged field tag: 0"):
        entity_reader(FetchRequest)(frame, 0)  # the first unknown one, inside replica_state
    stripped = strip_unknown_entity_tags(FetchRequest, frame)
    assert stripped == kio_bytes(FETCH_BODY)
    assert entity_reader(FetchRequest)(stripped, 0) == (FETCH_BODY, len(stripped))


def test_unknown_tags_only_inside_a_known_tagged_struct() -> None:
    frame = encode_entity(
        FetchRequest,
        FETCH_BODY,
        lambda name, known: [(7, b"\x01\x02")] if name == "ReplicaState" else [],
    )
    assert strip_unknown_entity_tags(FetchRequest, frame) == kio_bytes(FETCH_BODY)


def test_only_known_tags_pass_through_unchanged() -> None:
    frame = kio_bytes(FETCH_BODY)
    assert b"cluster-a" in frame
    assert strip_unknown_entity_tags(FetchRequest, frame) is frame


def test_entity_at_an_offset_keeps_the_surrounding_bytes() -> None:
    body = encode_entity(MetadataRequest, METADATA_BODY, lambda name, known: [(5, b"zz")])
    buffer = b"prefix" + body + b"suffix"
    stripped = strip_unknown_entity_tags(MetadataRequest, buffer, 6)
    assert stripped == b"prefix" + kio_bytes(METADATA_BODY) + b"suffix"


# --- malformed input ----------------------------------------------------------------------------


def test_every_truncation_is_refused() -> None:
    frame = metadata_frame_with_tag_99()
    for cut in range(len(frame)):
        with pytest.raises(TruncatedRequestError) as refused:
            strip_unknown_tagged_fields(MetadataRequest, frame[:cut])
        assert isinstance(refused.value, ValueError)
        assert any(
            name in str(refused.value)
            for name in ("RequestHeader", "MetadataRequest", "MetadataRequestTopic")
        )


def test_truncated_nested_tagged_value_names_the_field() -> None:
    frame = kio_bytes(FETCH_BODY)
    # replica_state's value is 13 bytes (int32, int64, no tags); claim 14 and supply 13 + 1 spare.
    start = frame.index(b"\x01\x0d\x00\x00\x00\x03")
    bad = frame[:start] + b"\x01\x0e" + frame[start + 2 :] + b"\x00"
    with pytest.raises(MalformedRequestError, match=r"FetchRequest\.replica_state \(tag 1\)"):
        strip_unknown_entity_tags(FetchRequest, bad)


@pytest.mark.parametrize(
    ("bad_tail", "message"),
    [
        (b"\x01\x80\x80\x80\x80\x80\x01", "longer than 5 bytes"),
        (b"\x01\xff\xff\xff\xff\x7f", "exceeds 32 bits"),
        (b"\x05\x63\x00", "fields cannot fit"),
        (b"\x01\x63\x09ab", "needs 9 bytes"),
    ],
)
def test_malformed_tagged_sections(bad_tail: bytes, message: str) -> None:
    frame = kio_bytes(METADATA_BODY)[:-1] + bad_tail
    with pytest.raises(MalformedRequestError, match=message):
        strip_unknown_entity_tags(MetadataRequest, frame)


def test_null_where_the_schema_has_none() -> None:
    # ApiVersions v3 starts with a non-nullable compact string; a 0 length prefix is a null.
    request_cls: Any = load_request_schema(18, 3)
    frame = kio_bytes(random_header(request_cls, random.Random(1))) + b"\x00\x00\x00"
    with pytest.raises(MalformedRequestError, match="client_software_name: null"):
        strip_unknown_tagged_fields(request_cls, frame)


def test_impossible_array_count() -> None:
    frame = b"\x90\x4e" + b"\x00" * 30  # a compact array of 9999 topics in 30 bytes
    with pytest.raises(TruncatedRequestError, match="9999 elements cannot fit"):
        strip_unknown_entity_tags(MetadataRequest, frame)


def test_other_key_errors_are_not_unknown_tags() -> None:
    assert not is_unknown_tagged_field_error(KeyError("name"))
    assert not is_unknown_tagged_field_error(ValueError("Unknown tagged field tag: 1"))
    assert is_unknown_tagged_field_error(KeyError("Unknown tagged field tag: 1"))
