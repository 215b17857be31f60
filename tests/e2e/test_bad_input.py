"""Bad bytes on the wire: the offending connection gets an error or is closed, nothing else.

Garbage, truncated, oversized and negative-size frames, unknown API keys and versions, a Produce
whose batch fails its CRC, and random frames (a seeded fuzz loop): after each, a fresh client
still produces and consumes, and nothing acknowledged before is lost.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct

import pytest
from kio.schema.produce.v9.request import ProduceRequest
from kio.schema.produce.v9.response import ProduceResponse
from kio.serial import entity_reader, entity_writer

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch import build_record_batch
from automq_ref.protocol.kio_codec import build
from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_clients import consume_all
from tests.waiting import PATIENCE_S

FUZZ_SEED = 20261122


class _Chunks(list[bytes]):
    def write(self, chunk: bytes) -> int:
        self.append(bytes(chunk))
        return len(chunk)


def connect(broker: BrokerProcess) -> socket.socket:
    # A hang guard: an answer or a close is awaited, never the timeout (the fuzz sets its own).
    return socket.create_connection(("127.0.0.1", broker.port), timeout=PATIENCE_S)


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack(">i", len(payload)) + payload)


def receive_frame(sock: socket.socket) -> bytes | None:
    """One response frame, or None if the broker closed the connection."""
    header = _receive_exactly(sock, 4)
    if header is None:
        return None
    return _receive_exactly(sock, struct.unpack(">i", header)[0])


def _receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def request_header(api_key: int, version: int, correlation_id: int, flexible: bool) -> bytes:
    header = struct.pack(">hhi", api_key, version, correlation_id)
    header += struct.pack(">h", 4) + b"fuzz"
    return header + (b"\x00" if flexible else b"")


def produce_request(topic: str, records: bytes, correlation_id: int = 7) -> bytes:
    request = build(
        ProduceRequest,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 10_000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
        },
    )
    body = _Chunks()
    entity_writer(ProduceRequest)(body, request)  # type: ignore[arg-type]
    return request_header(0, 9, correlation_id, True) + b"".join(body)


def produce_error(broker: BrokerProcess, topic: str, records: bytes) -> tuple[int, int]:
    with connect(broker) as sock:
        send_frame(sock, produce_request(topic, records))
        frame = receive_frame(sock)
    assert frame is not None, "the broker closed the connection instead of answering"
    # Response header v1: correlation id + tagged fields (one byte: none).
    response, _ = entity_reader(ProduceResponse)(frame, 5)
    partition = response.responses[0].partition_responses[0]
    return int(partition.error_code.value), int(partition.base_offset)


def assert_still_serving(broker: BrokerProcess, topic: str, expected: list[bytes]) -> None:
    got = consume_all(broker.bootstrap, topic, 1, len(expected))
    assert got == expected


@pytest.fixture(scope="module")
def topic(broker: BrokerProcess) -> str:
    name = "bad-input"
    batch = build_record_batch([(None, b"kept-0"), (None, b"kept-1")])
    assert produce_error(broker, name, batch) == (
        KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION.value,
        -1,
    )
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=1)])[name].result()
    assert produce_error(broker, name, batch) == (0, 0)
    return name


def test_bad_crc_is_corrupt_message_and_the_connection_lives(
    broker: BrokerProcess, topic: str
) -> None:
    batch = bytearray(build_record_batch([(None, b"flipped")]))
    batch[-1] ^= 0x01
    assert produce_error(broker, topic, bytes(batch))[0] == KafkaErrorCode.CORRUPT_MESSAGE.value
    assert_still_serving(broker, topic, [b"kept-0", b"kept-1"])


def test_inconsistent_batch_is_invalid_record(broker: BrokerProcess, topic: str) -> None:
    batch = bytearray(build_record_batch([(None, b"a"), (None, b"b")]))
    batch[23:27] = struct.pack(">i", 5)  # lastOffsetDelta no longer matches the record count
    code, _ = produce_error(broker, topic, bytes(batch))
    assert code in (KafkaErrorCode.INVALID_RECORD.value, KafkaErrorCode.CORRUPT_MESSAGE.value)


def test_idempotent_retry_gets_the_original_offset(broker: BrokerProcess, topic: str) -> None:
    batch = build_record_batch(
        [(None, b"idem")], producer_id=424242, producer_epoch=0, base_sequence=0
    )
    first = produce_error(broker, topic, batch)
    again = produce_error(broker, topic, batch)
    assert first[0] == 0 and again == first
    skipped = build_record_batch(
        [(None, b"gap")], producer_id=424242, producer_epoch=0, base_sequence=5
    )
    code, _ = produce_error(broker, topic, skipped)
    assert code == KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER.value


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(b"\xff\xff\xff\xff", id="negative-size"),
        pytest.param(struct.pack(">i", 200 * 1024 * 1024), id="oversized"),
        pytest.param(struct.pack(">i", 3) + b"abc", id="too-short-for-a-header"),
        pytest.param(
            struct.pack(">i", 12) + request_header(999, 0, 1, False)[:12], id="unknown-api"
        ),
        pytest.param(
            struct.pack(">i", 12) + request_header(3, 99, 1, False)[:12], id="unknown-version"
        ),
        pytest.param(
            struct.pack(">i", 20) + request_header(0, 9, 1, True) + b"\xff" * 5,
            id="truncated-produce",
        ),
    ],
)
def test_bad_frames_close_the_connection(broker: BrokerProcess, topic: str, frame: bytes) -> None:
    with connect(broker) as sock:
        sock.sendall(frame)
        assert receive_frame(sock) is None
    assert_still_serving(broker, topic, [b"kept-0", b"kept-1"])


def test_api_versions_beyond_the_maximum_gets_a_v0_answer(broker: BrokerProcess) -> None:
    with connect(broker) as sock:
        send_frame(sock, request_header(18, 77, 5, False) + b"\x00\x00\x00\x00")
        frame = receive_frame(sock)
    assert frame is not None
    correlation_id, error_code = struct.unpack_from(">ih", frame, 0)
    assert (correlation_id, error_code) == (5, KafkaErrorCode.UNSUPPORTED_VERSION.value)


def test_random_frames_do_not_take_the_broker_down(broker: BrokerProcess, topic: str) -> None:
    rng = random.Random(FUZZ_SEED)
    print(f"fuzz seed {FUZZ_SEED}")
    valid = produce_request(topic, build_record_batch([(None, b"fuzz")]))
    for _ in range(150):
        choice = rng.random()
        if choice < 0.4:
            body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        elif choice < 0.8:
            mutated = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.getrandbits(8)
            body = bytes(mutated)
        else:
            body = valid[: rng.randint(0, len(valid) - 1)]
        with connect(broker) as sock:
            send_frame(sock, body)
            sock.settimeout(5)
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                receive_frame(sock)
    assert broker.alive()
    got = consume_all(broker.bootstrap, topic, 1, 2)
    assert got[:2] == [b"kept-0", b"kept-1"]
