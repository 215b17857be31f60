"""Hand-written Kafka protocol codecs for the broker's two hot paths.

kio decodes and encodes every other API. Two messages carry the record data and are worth doing by
hand: the Fetch response, encoded into a list of chunks that passes record batches through without
copying them (:mod:`automq_ref.protocol.fetch`), and the Produce request, decoded into small frozen
dataclasses whose records are memoryview slices of the request frame
(:mod:`automq_ref.protocol.produce`). Both are checked byte for byte against kio in
``tests/unit/test_protocol_codecs.py``; ``bench/protocol_bench.py`` measures them against it.
A third is the Metadata response (:mod:`automq_ref.protocol.metadata`), not for its bytes but for
its size: a consumer of 1,000 partitions asks for all of them, and kio's generic path took tens
of milliseconds of the event loop to answer.
"""

from automq_ref.protocol.fetch import (
    FETCH_API_KEY,
    FETCH_MAX_VERSION,
    FETCH_MIN_VERSION,
    AbortedTransaction,
    FetchableTopicResponse,
    FetchPartition,
    FetchPartitionData,
    encode_fetch_response,
)
from automq_ref.protocol.primitives import (
    Chunk,
    MalformedRequestError,
    TruncatedRequestError,
    UnsupportedVersionError,
)
from automq_ref.protocol.produce import (
    PRODUCE_API_KEY,
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    PartitionProduceData,
    ProduceRequest,
    RequestHeader,
    TopicProduceData,
    decode_produce_frame,
    decode_produce_request,
    decode_request_header,
)

__all__ = [
    "FETCH_API_KEY",
    "FETCH_MAX_VERSION",
    "FETCH_MIN_VERSION",
    "PRODUCE_API_KEY",
    "PRODUCE_MAX_VERSION",
    "PRODUCE_MIN_VERSION",
    "AbortedTransaction",
    "Chunk",
    "FetchPartition",
    "FetchPartitionData",
    "FetchableTopicResponse",
    "MalformedRequestError",
    "PartitionProduceData",
    "ProduceRequest",
    "RequestHeader",
    "TopicProduceData",
    "TruncatedRequestError",
    "UnsupportedVersionError",
    "decode_produce_frame",
    "decode_produce_request",
    "decode_request_header",
    "encode_fetch_response",
]
