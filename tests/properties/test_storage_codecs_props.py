"""The storage codecs (MetaStream records and the partition checkpoint, topic records,
offsets-stream records, KV integers):
every value round-trips, and decoding anything else raises a FormatError, never another error.

"Anything else" is drawn three ways: arbitrary bytes, arbitrary JSON (valid syntax, any shape),
and the codec's own documents with one field replaced by arbitrary JSON, which is where a
decoder that trusts a field's type would fail with a TypeError or KeyError.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_ref.formats import group_record as gr
from automq_ref.formats import meta_stream as ms
from automq_ref.formats import partition_checkpoint as pc
from automq_ref.formats.errors import FormatError, InvalidFieldError
from automq_ref.formats.json_document import Json, decode_json
from automq_ref.formats.kv_integer import decode_kv_integer, encode_kv_integer
from automq_ref.formats.topic_record import Topic, decode_topic, encode_topic, topics_in
from automq_ref.vocabulary.naming import partition_key, topic_key

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
NON_NEGATIVE = st.integers(min_value=0, max_value=2**63 - 1)

json_values: st.SearchStrategy[Json] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)


def encoded(values: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return values.map(lambda value: json.dumps(value).encode())


def with_a_field_replaced(document: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """``document`` with one of its fields, or one item of a list field, replaced by any JSON."""

    def replace(choice: tuple[str, Json, int]) -> bytes:
        name, value, position = choice
        changed = dict(document)
        field = changed.get(name)
        if isinstance(field, list) and field:
            changed[name] = [*field]
            changed[name][position % len(field)] = value
        else:
            changed[name] = value
        return json.dumps(changed).encode()

    return st.tuples(st.sampled_from(sorted(document)), json_values, st.integers(0, 10)).map(
        replace
    )


def garbage(*documents: dict[str, Any]) -> st.SearchStrategy[bytes]:
    strategies = [st.binary(max_size=64), encoded(json_values)]
    strategies.extend(with_a_field_replaced(document) for document in documents)
    return st.one_of(strategies)


def refuses_with_format_error_only(decode: Callable[[bytes], object], payload: bytes) -> None:
    """Decodes ``payload`` or raises a FormatError; any other exception fails the test."""
    with contextlib.suppress(FormatError):
        decode(payload)


NESTED_TOO_DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE_INTEGER = b'{"k":"LOG","v":{"data":' + b"9" * 5000 + b"}}"


# ------------------------------------------------------------------------------ MetaStream


@given(key=st.text(max_size=30), value=json_values)
def test_meta_stream_entry_round_trip(key: str, value: Json) -> None:
    assert ms.decode_entry(ms.encode_entry(key, value)) == (key, value)


@given(
    data_stream_id=NON_NEGATIVE,
    epochs=st.lists(st.tuples(INT64, INT64), max_size=10),
    others=st.lists(st.tuples(st.text(max_size=10), json_values), max_size=3),
)
def test_meta_stream_replay_round_trip(
    data_stream_id: int, epochs: list[tuple[int, int]], others: list[tuple[str, Json]]
) -> None:
    """Known keys come back typed; keys the reader does not know are skipped."""
    unknown = [ms.encode_entry("x-" + key, value) for key, value in others]
    records = [
        ms.encode_log(data_stream_id + 1),  # overwritten below: the last value wins
        *unknown,
        ms.encode_leader_epochs([(0, 0)]),
        ms.encode_log(data_stream_id),
        ms.encode_leader_epochs(epochs),
    ]
    assert ms.replay(records) == ms.PartitionMeta(data_stream_id, tuple(epochs))
    assert ms.replay(unknown) == ms.PartitionMeta()


def test_meta_stream_layout_is_the_brokers() -> None:
    assert ms.encode_log(11) == b'{"k":"LOG","v":{"data":11}}'
    assert ms.encode_leader_epochs([(0, 0), (1, 7)]) == b'{"k":"LEADER_EPOCHS","v":[[0,0],[1,7]]}'


@given(
    payload=garbage(
        {"k": "LOG", "v": {"data": 3}},
        {"k": "LEADER_EPOCHS", "v": [[0, 0], [1, 5]]},
    )
)
def test_meta_stream_decoding_anything_raises_only_format_errors(payload: bytes) -> None:
    refuses_with_format_error_only(ms.decode_entry, payload)
    refuses_with_format_error_only(lambda raw: ms.replay([raw]), payload)


@pytest.mark.parametrize("payload", [NESTED_TOO_DEEP, HUGE_INTEGER, b"\xff\xfe{", b""])
def test_meta_stream_refuses_pathological_json(payload: bytes) -> None:
    with pytest.raises(FormatError):
        ms.replay([payload])


@given(
    records=st.lists(
        st.tuples(st.sampled_from(["LOG", "LEADER_EPOCHS", "CLEANING", "CLEANED", "x"]), INT64),
        max_size=20,
    )
)
def test_meta_stream_latest_records_replay_as_all(records: list[tuple[str, int]]) -> None:
    """What a MetaStream compaction keeps (the last record of each key) replays as every
    record does."""
    values = {
        "LOG": lambda n: ms.encode_log(abs(n)),
        "LEADER_EPOCHS": lambda n: ms.encode_leader_epochs([(0, 0), (1, n)]),
        "CLEANING": lambda n: ms.encode_cleaning(abs(n)),
        "CLEANED": lambda n: ms.encode_cleaned(abs(n), abs(n), None),
        "x": lambda n: ms.encode_checkpoint_record({"n": n}),
    }
    payloads = [values[key](n) for key, n in records]
    latest = ms.latest_records(payloads)
    assert ms.replay(latest.values()) == ms.replay(payloads)
    assert len(latest) == len({key for key, _ in records})


# ----------------------------------------------------------------------- partition checkpoint

index_spans = st.lists(
    st.tuples(
        st.integers(0, 1000),  # gap to the previous batch
        st.integers(1, 1000),  # length in offsets
        INT64,  # max timestamp
        st.integers(0, 2**31),  # size
        st.booleans(),  # emptied by compaction
    ),
    max_size=50,
)
producer_rows = st.lists(
    st.builds(
        pc.ProducerRow,
        st.integers(0, 2**63 - 1),
        st.integers(-1, 2**15),
        st.lists(
            st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), NON_NEGATIVE),
            max_size=5,
        ).map(tuple),
        st.integers(-(2**63), 2**63 - 1),  # the last timestamp (-1: unknown)
    ),
    max_size=5,
    unique_by=lambda row: row.producer_id,
)


@given(spans=index_spans, producers=producer_rows, slack=st.integers(0, 100))
def test_partition_checkpoint_round_trip(
    spans: list[tuple[int, int, int, int, bool]], producers: list[pc.ProducerRow], slack: int
) -> None:
    rows = []
    end = 0
    for gap, length, timestamp, size, emptied in spans:
        rows.append((end + gap, end + gap + length, timestamp, size, emptied))
        end += gap + length
    cleaned = (4, 5) if slack % 2 else None
    value = pc.encode_checkpoint(3, cleaned, end + slack, rows, producers)
    decoded = pc.decode_checkpoint(json.loads(json.dumps(value)))
    assert (decoded.data_stream_id, decoded.cleaned, decoded.end) == (3, cleaned, end + slack)
    columns = (
        decoded.base_offsets,
        decoded.end_offsets,
        decoded.max_timestamps,
        decoded.sizes,
        [bool(flag) for flag in decoded.emptied],
    )
    assert list(zip(*columns, strict=True)) == rows
    assert list(decoded.producers) == producers


def test_partition_checkpoint_index_past_its_end_is_refused() -> None:
    value = pc.encode_checkpoint(1, None, 5, [(0, 10, 0, 100, False)], [])
    with pytest.raises(InvalidFieldError):
        pc.decode_checkpoint(value)


CHECKPOINT_DOCUMENT: dict[str, Any] = pc.encode_checkpoint(  # type: ignore[assignment]
    2, (3, 4), 9, [(0, 4, 1, 70, False), (5, 9, 2, 80, True)], [pc.ProducerRow(1, 0, ((0, 3, 0),))]
)


def with_a_batches_field_replaced() -> st.SearchStrategy[bytes]:
    """The checkpoint with one field of its ``batches`` object replaced by any JSON."""
    return with_a_field_replaced(CHECKPOINT_DOCUMENT["batches"]).map(
        lambda raw: json.dumps({**CHECKPOINT_DOCUMENT, "batches": json.loads(raw)}).encode()
    )


@given(payload=garbage(CHECKPOINT_DOCUMENT) | with_a_batches_field_replaced())
def test_partition_checkpoint_decoding_anything_raises_only_format_errors(payload: bytes) -> None:
    refuses_with_format_error_only(
        lambda raw: pc.decode_checkpoint(decode_json(raw, "checkpoint")), payload
    )


# ---------------------------------------------------------------------------- topic records

topics = st.builds(
    Topic,
    name=st.text(min_size=1, max_size=30),
    topic_id=st.uuids(),
    partitions=st.integers(min_value=0, max_value=2**31 - 1),
    configs=st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=5),
)


@given(topic=topics)
def test_topic_record_round_trip(topic: Topic) -> None:
    assert decode_topic(topic.name, encode_topic(topic)) == topic
    assert Topic.decode(topic.name, topic.encode()) == topic


def test_topic_record_layout_is_the_brokers() -> None:
    topic = Topic("t", uuid.UUID(int=7), 3, {"retention.ms": "1000"})
    assert topic.encode() == (
        b'{"configs":{"retention.ms":"1000"},'
        b'"id":"00000000-0000-0000-0000-000000000007","partitions":3}'
    )


@given(found=st.lists(topics, max_size=5, unique_by=lambda topic: topic.name))
def test_topics_in_finds_every_topic_and_nothing_else(found: list[Topic]) -> None:
    kv = {topic_key(topic.name): topic.encode() for topic in found}
    kv.update({partition_key(topic.topic_id, 0): b"12" for topic in found})
    assert topics_in(kv) == {topic.name: topic for topic in found}


@given(
    payload=garbage(
        {"id": str(uuid.UUID(int=7)), "partitions": 3, "configs": {"retention.ms": "1"}}
    )
)
def test_topic_record_decoding_anything_raises_only_format_errors(payload: bytes) -> None:
    refuses_with_format_error_only(lambda raw: decode_topic("t", raw), payload)


# -------------------------------------------------------------------- offsets-stream records

stored_offsets = st.builds(
    gr.StoredOffset,
    topic=st.text(max_size=20),
    partition=st.integers(min_value=-1, max_value=2**31 - 1),
    offset=INT64,
    leader_epoch=st.integers(min_value=-1, max_value=2**31 - 1),
    metadata=st.text(max_size=20),
    commit_timestamp_ms=INT64,
)
group_records: st.SearchStrategy[gr.GroupRecord] = st.one_of(
    st.builds(
        gr.OffsetsCommitted,
        group_id=st.text(max_size=20),
        offsets=st.lists(stored_offsets, max_size=5).map(tuple),
    ),
    st.builds(gr.GroupsDeleted, group_ids=st.lists(st.text(max_size=20), max_size=5).map(tuple)),
)


@given(record=group_records)
def test_group_record_round_trip(record: gr.GroupRecord) -> None:
    assert gr.decode_group_record(gr.encode_group_record(record)) == record


def test_group_record_layout_is_the_coordinators() -> None:
    offsets = gr.OffsetsCommitted("g", (gr.StoredOffset("t", 0, 42, 3, "", 1000),))
    assert gr.encode_group_record(offsets) == (
        b'{"type":"offsets","group":"g","offsets":[["t",0,42,3,"",1000]]}'
    )
    deleted = gr.GroupsDeleted(("a", "b"))
    assert gr.encode_group_record(deleted) == b'{"type":"delete","groups":["a","b"]}'


@given(
    payload=garbage(
        {"type": "offsets", "group": "g", "offsets": [["t", 0, 42, 3, "", 1000]]},
        {"type": "delete", "groups": ["a", "b"]},
    )
)
def test_group_record_decoding_anything_raises_only_format_errors(payload: bytes) -> None:
    refuses_with_format_error_only(gr.decode_group_record, payload)


# ----------------------------------------------------------------------------- KV integers


@given(value=INT64)
def test_kv_integer_round_trip(value: int) -> None:
    assert decode_kv_integer(encode_kv_integer(value), "value") == value
    assert encode_kv_integer(value) == str(value).encode()


@given(
    payload=st.binary(max_size=30)
    | st.text(max_size=30).map(str.encode)
    | INT64.map(lambda value: f" {value}\n".encode())
)
def test_kv_integer_decoding_anything_raises_only_format_errors(payload: bytes) -> None:
    refuses_with_format_error_only(lambda raw: decode_kv_integer(raw, "value"), payload)


@pytest.mark.parametrize(
    "payload", [b"", b"-", b"+1", b" 1", b"1\n", b"1_000", b"\xd9\xa1", b"9" * 21]
)
def test_kv_integer_refuses_what_the_broker_never_writes(payload: bytes) -> None:
    with pytest.raises(FormatError):
        decode_kv_integer(payload, "value")
