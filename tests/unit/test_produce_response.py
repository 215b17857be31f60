"""The hand-written Produce response encoder writes exactly kio's bytes, for every version."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from automq_ref.protocol.kio_codec import build, encode_response, response_class
from automq_ref.protocol.produce_response import (
    PRODUCE_RESPONSE_MAX_VERSION,
    PRODUCE_RESPONSE_MIN_VERSION,
    ProducePartitionAnswer,
    encode_produce_response,
)

answers = st.builds(
    ProducePartitionAnswer,
    index=st.integers(0, 2**31 - 1),
    error_code=st.sampled_from([0, 2, 3, 6, 45, 47, 87]),
    base_offset=st.integers(-1, 2**63 - 1),
    log_append_time_ms=st.just(-1),
    log_start_offset=st.integers(-1, 2**63 - 1),
    error_message=st.none() | st.text(max_size=20),
)
topics = st.lists(
    st.tuples(st.text(min_size=1, max_size=30), st.lists(answers, max_size=4)), max_size=3
)


def kio_bytes(version: int, correlation_id: int, data: list[Any], throttle: int) -> bytes:
    values = {
        "throttle_time": throttle,
        "responses": [
            {
                "name": name,
                "partition_responses": [
                    {
                        "index": a.index,
                        "error_code": a.error_code,
                        "base_offset": a.base_offset,
                        "log_append_time": None,
                        "log_start_offset": a.log_start_offset,
                        "record_errors": [],
                        "error_message": a.error_message,
                    }
                    for a in answers_
                ],
            }
            for name, answers_ in data
        ],
    }
    response = build(response_class(0, version), values)
    return b"".join(encode_response(0, version, correlation_id, response))


@given(
    version=st.integers(PRODUCE_RESPONSE_MIN_VERSION, PRODUCE_RESPONSE_MAX_VERSION),
    correlation_id=st.integers(-(2**31), 2**31 - 1),
    data=topics,
    throttle=st.integers(0, 10_000),
)
def test_matches_kio(version: int, correlation_id: int, data: list[Any], throttle: int) -> None:
    ours = encode_produce_response(version, correlation_id, data, throttle)
    assert ours == kio_bytes(version, correlation_id, data, throttle)
