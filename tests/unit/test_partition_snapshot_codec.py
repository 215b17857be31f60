"""AutomqGetPartitionSnapshot's codec (automq_ref/protocol/partition_snapshot.py): requests and
responses of every version round-trip, fields a version lacks are left out, frames carry their
headers, the transaction tags (a partition's aborted entries and where the older ones end, the
aborted-transaction queries and their answers) round-trip in every version and are laid out as
tagged fields, unknown tagged fields are skipped and malformed input is refused."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_ref.protocol import partition_snapshot as ps
from automq_ref.protocol.primitives import MalformedRequestError, UnsupportedVersionError

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
VERSIONS = st.integers(ps.MIN_VERSION, ps.MAX_VERSION)

slices = st.builds(ps.SliceRange, I64, I64)
stamps = st.builds(ps.TimestampOffset, I64, I64)
segments = st.builds(
    ps.SegmentMetadata,
    I64,
    I64,
    I64,
    st.text(max_size=8),
    I32,
    slices,
    slices,
    slices,
    I64,
    stamps,
)
log_metadata = st.builds(
    ps.LogMetadata,
    st.lists(segments, max_size=3).map(tuple),
    st.lists(st.tuples(st.text(max_size=8), I64), max_size=3).map(tuple),
)
offsets = st.builds(ps.LogOffset, I64, I32)
aborted_ranges = st.lists(st.builds(ps.AbortedRange, I64, I64, I64), max_size=3).map(tuple)
partitions = st.builds(
    ps.PartitionSnapshot,
    I32,
    I32,
    st.sampled_from(ps.SnapshotOperation),
    st.none() | log_metadata,
    st.none() | offsets,
    st.none() | offsets,
    st.none() | st.lists(st.builds(ps.StreamEnd, I64, I64), max_size=3).map(tuple),
    st.none() | stamps,
    aborted_ranges,
    st.none() | I64,
)
queries = st.lists(st.builds(ps.AbortedQuery, st.uuids(), I32, I64, I64, I64), max_size=3)
answers = st.lists(
    st.builds(ps.AbortedAnswer, st.uuids(), I32, st.integers(-(2**15), 2**15 - 1), aborted_ranges),
    max_size=3,
)
responses = st.builds(
    ps.GetPartitionSnapshotResponse,
    st.integers(-(2**15), 2**15 - 1),
    I32,
    I32,
    I32,
    st.lists(
        st.builds(ps.TopicSnapshot, st.uuids(), st.lists(partitions, max_size=3).map(tuple)),
        max_size=3,
    ).map(tuple),
    st.binary(max_size=30),
    st.text(max_size=20),
    st.none() | st.binary(max_size=40),
    answers.map(tuple),
)


def as_version(
    response: ps.GetPartitionSnapshotResponse, version: int
) -> ps.GetPartitionSnapshotResponse:
    """What a version carries of ``response`` (the rest at its default)."""
    topics = tuple(
        ps.TopicSnapshot(
            topic.topic_id,
            tuple(
                p
                if version >= 1
                # v0 has no last timestamp; the tagged fields are in every version.
                else dataclasses.replace(p, last_timestamp_offset=None)
                for p in topic.partitions
            ),
        )
        for topic in response.topics
    )
    return ps.GetPartitionSnapshotResponse(
        response.error_code,
        response.throttle_time_ms,
        response.session_id,
        response.session_epoch,
        topics,
        response.confirm_wal_end_offset if version >= 1 else b"",
        response.confirm_wal_config if version >= 1 else "",
        response.confirm_wal_delta_data if version >= 2 else None,
        response.aborted_answers,
    )


@given(responses, VERSIONS)
def test_responses_round_trip(response: ps.GetPartitionSnapshotResponse, version: int) -> None:
    encoded = ps.encode_response(response, version)
    assert ps.decode_response(encoded, version) == as_version(response, version)
    frame = ps.encode_response_frame(response, version, 77)
    assert ps.decode_response_frame(frame, version) == (77, as_version(response, version))


@given(I32, I32, st.booleans(), st.integers(-(2**15), 2**15 - 1), queries, VERSIONS)
def test_requests_round_trip(
    session_id: int,
    epoch: int,
    commit: bool,
    route_version: int,
    asked: list[ps.AbortedQuery],
    version: int,
) -> None:
    request = ps.GetPartitionSnapshotRequest(session_id, epoch, commit, route_version, tuple(asked))
    expected = (
        request
        if version >= 1
        else ps.GetPartitionSnapshotRequest(session_id, epoch, False, 0, tuple(asked))
    )
    assert ps.decode_request(ps.encode_request(request, version), version) == expected
    frame = ps.encode_request_frame(request, version, 5, "proxy-2")
    assert ps.decode_request_frame(frame) == (version, 5, "proxy-2", expected)


def test_the_request_layout_of_v2() -> None:
    """SessionId, SessionEpoch, RequestCommit, Version, then an empty tagged-field section."""
    request = ps.GetPartitionSnapshotRequest(7, 3, True, 1)
    assert ps.encode_request(request, 2) == bytes.fromhex("000000070000000301000100")


def test_the_transaction_tags_are_tagged_fields() -> None:
    """A query rides in the request's tag 0; a partition's entries in its tag 0 and where the
    older entries end in its tag 1; the answers in the response's tag 0. Nothing is written
    when there is nothing to say, so such a message is byte for byte what it was."""
    topic = uuid.UUID(int=5)
    query = ps.AbortedQuery(topic, 2, 10, 40, 90)
    request = ps.GetPartitionSnapshotRequest(ps.QUERY_SESSION_ID, -1, False, 1, (query,))
    assert (
        ps.encode_request(request, 2)
        == bytes.fromhex(
            "ffffffff"
            "ffffffff"
            "00"
            "0001"  # session id, epoch, commit, version
            "01"
            "00"
            "2e"  # one tagged field: tag 0, 46 bytes
            "02" + topic.bytes.hex() + "00000002"
            "000000000000000a"
            "0000000000000028"
            "000000000000005a"
            "00"  # one query, its empty tags: the request's last byte
        )
    )
    plain = ps.GetPartitionSnapshotRequest(7, 3, True, 1)
    assert ps.encode_request(plain, 2) == bytes.fromhex("000000070000000301000100")
    partition = ps.PartitionSnapshot(
        0, 1, ps.SnapshotOperation.PATCH, aborted=(ps.AbortedRange(9, 3, 5),), aborted_below=2
    )
    encoded = ps.encode_response(
        ps.GetPartitionSnapshotResponse(topics=(ps.TopicSnapshot(topic, (partition,)),)), 2
    )
    tags = bytes.fromhex(
        "02001a020000000000000009000000000000000300000000000000050001080000000000000002"
    )
    assert tags in encoded
    untagged = ps.encode_response(
        ps.GetPartitionSnapshotResponse(
            topics=(ps.TopicSnapshot(topic, (ps.PartitionSnapshot(0, 1, partition.operation),)),)
        ),
        2,
    )
    assert encoded.replace(tags, b"\x00") == untagged
    answer = ps.AbortedAnswer(topic, 2, 0, (ps.AbortedRange(9, 3, 5),))
    answered = ps.GetPartitionSnapshotResponse(session_id=-1, aborted_answers=(answer,))
    assert ps.decode_response(ps.encode_response(answered, 2), 2) == answered
    assert ps.encode_response(ps.GetPartitionSnapshotResponse(), 2).endswith(b"\x00")


def test_a_null_delta_differs_from_an_empty_one() -> None:
    for delta in (None, b""):
        response = ps.GetPartitionSnapshotResponse(confirm_wal_delta_data=delta)
        assert (
            ps.decode_response(ps.encode_response(response, 2), 2).confirm_wal_delta_data == delta
        )


def test_unknown_tagged_fields_are_skipped() -> None:
    body = ps.encode_request(ps.GetPartitionSnapshotRequest(1, 2, False, 1), 1)
    tagged = body[:-1] + bytes([1, 9, 2, 0xAB, 0xCD])  # one field: tag 9, two bytes
    assert ps.decode_request(tagged, 1) == ps.GetPartitionSnapshotRequest(1, 2, False, 1)


def test_malformed_input_is_refused() -> None:
    query = ps.AbortedQuery(uuid.UUID(int=1), 0, 0, 1, 2)
    asking = ps.encode_request(ps.GetPartitionSnapshotRequest(1, 2, True, 1, (query,)), 1)
    size_at = 4 + 4 + 1 + 2 + 1 + 1  # the tagged field's size
    with pytest.raises(MalformedRequestError, match="tag 0"):  # a size past the query's end
        ps.decode_request(
            asking[:size_at] + bytes([asking[size_at] + 1]) + asking[size_at + 1 :] + b"\x00", 1
        )
    body = ps.encode_request(ps.GetPartitionSnapshotRequest(1, 2, True, 1), 1)
    with pytest.raises(MalformedRequestError):
        ps.decode_request(body[:-2], 1)  # truncated
    with pytest.raises(MalformedRequestError):
        ps.decode_request(body + b"\x00", 1)  # trailing bytes
    with pytest.raises(MalformedRequestError):
        ps.decode_request(body[:8] + b"\x02" + body[9:], 1)  # a boolean of 2
    with pytest.raises(UnsupportedVersionError):
        ps.encode_request(ps.GetPartitionSnapshotRequest(), 3)
    bad_operation = ps.GetPartitionSnapshotResponse(
        topics=(
            ps.TopicSnapshot(uuid.uuid4(), (ps.PartitionSnapshot(0, 0, ps.SnapshotOperation.ADD),)),
        )
    )
    encoded = bytearray(ps.encode_response(bad_operation, 0))
    operation_at = 2 + 4 + 4 + 4 + 1 + 16 + 1 + 4 + 4
    encoded[operation_at : operation_at + 2] = b"\x00\x07"
    with pytest.raises(MalformedRequestError, match="Operation"):
        ps.decode_response(bytes(encoded), 0)
