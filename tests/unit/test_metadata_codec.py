"""The hand-written Metadata response encoder gives kio's bytes, at every version.

hypothesis builds a typed response (the broker's ``MetadataResponse``, with what each version
can carry: names before v12 and hosts are never null), kio's path encodes it
(:func:`automq_ref.kafka.responses.encode`: plain values, kio's classes, kio's writer) and the
encoder must write the same bytes.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.responses import (
    MetadataBroker,
    MetadataPartition,
    MetadataResponse,
    MetadataTopic,
    encode,
)
from automq_ref.protocol.metadata import (
    METADATA_MAX_VERSION,
    METADATA_MIN_VERSION,
    encode_metadata_response,
)
from automq_ref.protocol.primitives import UnsupportedVersionError

VERSIONS = range(METADATA_MIN_VERSION, METADATA_MAX_VERSION + 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
NODE = st.integers(-1, 2**31 - 1)
TEXT = st.text(max_size=20)
CODES = st.sampled_from(list(KafkaErrorCode))
NODES = st.lists(NODE, max_size=4)

partitions = st.builds(
    MetadataPartition,
    partition_index=INT32,
    leader_id=NODE,
    leader_epoch=INT32,
    replica_nodes=NODES,
    isr_nodes=NODES,
    offline_replicas=NODES,
    error_code=CODES,
)
brokers = st.builds(
    MetadataBroker, node_id=NODE, host=TEXT, port=st.integers(0, 65535), rack=st.none() | TEXT
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[int, int, MetadataResponse]:
    version = draw(st.sampled_from(VERSIONS))
    topics = st.builds(
        MetadataTopic,
        name=TEXT if version < 12 else st.none() | TEXT,
        topic_id=st.uuids(),
        partitions=st.lists(partitions, max_size=5),
        error_code=CODES,
        is_internal=st.booleans(),
        topic_authorized_operations=INT32,
    )
    response = MetadataResponse(
        brokers=draw(st.lists(brokers, max_size=3)),
        cluster_id=draw(st.none() | TEXT),  # type: ignore[arg-type]
        controller_id=draw(NODE),
        topics=draw(st.lists(topics, max_size=3)),
        error_code=draw(CODES),
        cluster_authorized_operations=draw(INT32),
        throttle_time=draw(st.integers(0, 2**31 - 1)),
    )
    return version, draw(INT32), response


@settings(max_examples=300)
@given(cases())
def test_metadata_response_matches_kio(case: tuple[int, int, MetadataResponse]) -> None:
    version, correlation_id, response = case
    kio_bytes = b"".join(encode(version, correlation_id, response))
    assert b"".join(encode_metadata_response(version, correlation_id, response)) == kio_bytes


@pytest.mark.parametrize("version", VERSIONS)
def test_metadata_of_many_partitions_matches_kio(version: int) -> None:
    """A topic of 1,000 partitions led by one broker (its replica lists packed once), and a
    partition led by none."""
    led = [MetadataPartition(index, 1, 7, [1], [1]) for index in range(1000)]
    unled = [MetadataPartition(0, -1, -1, [], [], error_code=KafkaErrorCode.LEADER_NOT_AVAILABLE)]
    response = MetadataResponse(
        brokers=[MetadataBroker(1, "127.0.0.1", 9092, "zone-a"), MetadataBroker(2, "h", 1)],
        cluster_id="cluster",
        controller_id=1,
        topics=[
            MetadataTopic("many", uuid.UUID(int=5), led),
            MetadataTopic("unled", uuid.UUID(int=6), unled, is_internal=True),
        ],
    )
    assert encode_metadata_response(version, 9, response) == [
        b"".join(encode(version, 9, response))
    ]


def test_a_nameless_topic_before_v12_is_refused() -> None:
    response = MetadataResponse([], "c", 1, [MetadataTopic(None, uuid.UUID(int=1))])
    with pytest.raises(ValueError, match="without a name"):
        encode_metadata_response(11, 1, response)
    assert encode_metadata_response(12, 1, response) == [b"".join(encode(12, 1, response))]


@pytest.mark.parametrize("version", [METADATA_MIN_VERSION - 1, METADATA_MAX_VERSION + 1])
def test_metadata_unsupported_version(version: int) -> None:
    with pytest.raises(UnsupportedVersionError):
        encode_metadata_response(version, 1, MetadataResponse([], "c", 1, []))
