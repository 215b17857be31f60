"""A small synchronous Kafka client: metadata, offsets and raw fetches over blocking sockets.

The ``automq`` Spark source needs four requests and nothing else: ApiVersions (to pick versions),
Metadata (topic names to partitions and their leaders), ListOffsets (earliest and latest offsets)
and Fetch (raw record-batch bytes from an offset). A client made with ``read_committed=True``
asks both ListOffsets and Fetch at READ_COMMITTED (``isolation_level`` 1): the latest offset is
then the last stable offset, a Fetch reads up to it and answers the aborted transactions its
records may meet (:attr:`FetchResult.aborted_transactions`). It runs on the Spark driver, to
plan, and in executors' Python workers, to read; both are plain synchronous code, so the client
is one object holding one blocking socket per broker, no threads, no event loop, no consumer
group.

Messages are built and parsed with kio, the library the broker itself uses: a request is a kio
dataclass (made from plain values with :func:`automq_ref.protocol.kio_codec.build`) written after
its RequestHeader (v1, or v2 for flexible versions, with client id and correlation id); a response
is read after its ResponseHeader (v0 or v1), and its correlation id is checked. For each API the
client takes the highest version both it and the broker support (ApiVersions, once per
connection).

Routing: every partition is read from, and its offsets listed at, the leader Metadata names. With
one broker the leader is the bootstrap broker itself, reached through its advertised address. On a
cluster of brokers a partition may move, or its broker die, between the driver's planning and an
executor's read: a leader that answers NOT_LEADER_OR_FOLLOWER, a Metadata answer naming no live
leader (a move in progress) and a leader that cannot be reached all send the client back to
Metadata (asked of any broker it knows) for the new leader, with backoff, a few times.

Errors: a Kafka error code in a response raises :class:`KafkaResponseError` (or its subclass
:class:`OffsetOutOfRangeError`), whose message names the code, the topic and the partition.
Errors that a leader change or a metadata refresh may cure (NOT_LEADER_OR_FOLLOWER,
LEADER_NOT_AVAILABLE, epochs, UNKNOWN_TOPIC_ID, REQUEST_TIMED_OUT) are retried a few times after
refreshing metadata first. A connection that cannot be made, or breaks mid-request, is retried
with exponential backoff (for a leader, after refreshing metadata), then
:class:`KafkaConnectionError` names the address and the cause.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from automq_ref.errors import KafkaErrorCode

__all__ = [
    "EARLIEST",
    "LATEST",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "FetchResult",
    "KafkaClient",
    "KafkaClientError",
    "KafkaConnectionError",
    "KafkaResponseError",
    "OffsetOutOfRangeError",
    "PartitionMetadata",
    "TopicMetadata",
    "parse_bootstrap",
]

EARLIEST: Final = -2
"""ListOffsets timestamp asking for the log start offset."""
LATEST: Final = -1
"""ListOffsets timestamp asking for the high watermark (the next offset to be written), or for
the last stable offset at READ_COMMITTED."""
READ_UNCOMMITTED: Final = 0
READ_COMMITTED: Final = 1
"""The ``isolation_level`` of ListOffsets (v2+) and Fetch (v4+)."""

API_VERSIONS_KEY: Final = 18
METADATA_KEY: Final = 3
LIST_OFFSETS_KEY: Final = 2
FETCH_KEY: Final = 1

# The versions this client can speak (kio's schemas cover them all); the highest one the broker
# also supports is used.
CLIENT_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    METADATA_KEY: (1, 13),
    LIST_OFFSETS_KEY: (1, 10),
    FETCH_KEY: (4, 17),
}
_API_VERSIONS_VERSION: Final = 3
_LIST_OFFSETS_FIRST_ISOLATION_VERSION: Final = 2
_FETCH_FIRST_TOPIC_ID_VERSION: Final = 13

_RETRIABLE: Final = frozenset(
    {
        KafkaErrorCode.LEADER_NOT_AVAILABLE,
        KafkaErrorCode.NOT_LEADER_OR_FOLLOWER,
        KafkaErrorCode.REQUEST_TIMED_OUT,
        KafkaErrorCode.FENCED_LEADER_EPOCH,
        KafkaErrorCode.UNKNOWN_LEADER_EPOCH,
        KafkaErrorCode.UNKNOWN_TOPIC_ID,
        KafkaErrorCode.OFFSET_NOT_AVAILABLE,
    }
)


def error_name(code: int) -> str:
    try:
        return KafkaErrorCode(code).name
    except ValueError:
        return f"UNKNOWN_ERROR_{code}"


class KafkaClientError(Exception):
    """Anything that stops the client from answering."""


class KafkaConnectionError(KafkaClientError):
    """No broker could be reached, or the connection broke, after the retries."""


class KafkaResponseError(KafkaClientError):
    """A response carried a Kafka error code; the message names it."""

    def __init__(
        self, code: int, what: str, *, topic: str | None = None, partition: int | None = None
    ) -> None:
        self.code = code
        self.topic = topic
        self.partition = partition
        where = ""
        if topic is not None:
            where = f" for {topic}" + ("" if partition is None else f"-{partition}")
        super().__init__(f"{what}{where}: Kafka error {error_name(code)} ({code})")


class OffsetOutOfRangeError(KafkaResponseError):
    """A fetch offset outside [log start, high watermark]: records were trimmed, or not yet
    written. Carries the partition's bounds from the response."""

    def __init__(
        self, topic: str, partition: int, offset: int, log_start_offset: int, high_watermark: int
    ) -> None:
        super().__init__(
            KafkaErrorCode.OFFSET_OUT_OF_RANGE,
            f"Fetch at offset {offset} (log start {log_start_offset}, "
            f"high watermark {high_watermark})",
            topic=topic,
            partition=partition,
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.high_watermark = high_watermark


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    topic: str
    partition: int
    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID
    partitions: tuple[PartitionMetadata, ...]


@dataclass(frozen=True, slots=True)
class FetchResult:
    """One partition of a Fetch response: ``records`` are raw RecordBatch bytes, possibly
    starting before the fetch offset (the batch holding it) and ending inside a batch. At
    READ_COMMITTED they end at the last stable offset, and ``aborted_transactions`` lists
    (producer id, first offset) of the aborted transactions they may meet (at
    READ_UNCOMMITTED: None)."""

    topic: str
    partition: int
    high_watermark: int
    log_start_offset: int
    records: bytes
    last_stable_offset: int = -1
    aborted_transactions: tuple[tuple[int, int], ...] | None = None


def parse_bootstrap(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` (or a list of ``host:port``) as (host, port) pairs."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    addresses: list[tuple[str, int]] = []
    for item in (entry.strip() for entry in items):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bootstrap server {item!r} is not host:port")
        addresses.append((host.strip("[]"), int(port)))
    if not addresses:
        raise ValueError("no bootstrap servers given")
    return addresses


class _ConnectionClosed(OSError):
    pass


class _Chunks(list[bytes]):
    def write(self, chunk: bytes | memoryview) -> int:
        self.append(bytes(chunk))
        return len(chunk)


_READERS: dict[Any, Any] = {}
_WRITERS: dict[Any, Any] = {}


def _read(cls: Any, frame: bytes, offset: int) -> tuple[Any, int]:
    reader: Any = _READERS.get(cls)
    if reader is None:
        from kio.serial import entity_reader

        reader = _READERS[cls] = entity_reader(cls)
    value, size = reader(frame, offset)
    return value, offset + size


def _write(cls: Any, out: _Chunks, value: Any) -> None:
    writer: Any = _WRITERS.get(cls)
    if writer is None:
        from kio.serial import entity_writer

        writer = _WRITERS[cls] = entity_writer(cls)
    writer(out, value)


class _Connection:
    """One blocking socket to one broker, with the versions it supports."""

    def __init__(self, address: tuple[str, int], client_id: str, timeout_s: float) -> None:
        self.address = address
        self.client_id = client_id
        self.sock = socket.create_connection(address, timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation_id = 0
        self.versions: dict[int, tuple[int, int]] = {}

    def close(self) -> None:
        self.sock.close()

    def request(self, api_key: int, version: int, values: dict[str, Any]) -> Any:
        # kio (and the hypothesis it imports) takes about a second to import: only processes
        # that talk to a broker pay for it, not Spark's option-checking workers.
        from automq_ref.protocol.kio_codec import build, request_class, response_class

        cls = request_class(api_key, version)
        self.correlation_id = (self.correlation_id + 1) & 0x7FFFFFFF
        header_cls = cls.__header_schema__
        out = _Chunks()
        _write(
            header_cls,
            out,
            header_cls(
                request_api_key=api_key,
                request_api_version=version,
                correlation_id=self.correlation_id,
                client_id=self.client_id,
            ),
        )
        _write(cls, out, build(cls, values))
        payload = b"".join(out)
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        frame = self._receive(struct.unpack(">i", self._receive(4))[0])
        response_cls = response_class(api_key, version)
        header, offset = _read(response_cls.__header_schema__, frame, 0)
        if int(header.correlation_id) != self.correlation_id:
            raise _ConnectionClosed(
                f"correlation id {header.correlation_id} in a response to "
                f"{self.correlation_id}: the connection is out of step"
            )
        if api_key == API_VERSIONS_KEY and struct.unpack_from(">h", frame, offset)[0] != 0:
            # An ApiVersions error (UNSUPPORTED_VERSION) comes as a v0 body whatever was asked.
            response_cls = response_class(API_VERSIONS_KEY, 0)
        body, _ = _read(response_cls, frame, offset)
        return body

    def _receive(self, size: int) -> bytes:
        buffer = bytearray(size)
        view = memoryview(buffer)
        received = 0
        while received < size:
            count = self.sock.recv_into(view[received:], size - received)
            if count == 0:
                raise _ConnectionClosed(f"broker {self.address[0]}:{self.address[1]} closed")
            received += count
        return bytes(buffer)

    def negotiate(self) -> None:
        response = self.request(
            API_VERSIONS_KEY,
            _API_VERSIONS_VERSION,
            {"client_software_name": "automq-ref-spark", "client_software_version": "1"},
        )
        if int(response.error_code) == KafkaErrorCode.UNSUPPORTED_VERSION:
            response = self.request(API_VERSIONS_KEY, 0, {})
        if int(response.error_code) != 0:
            raise KafkaResponseError(int(response.error_code), "ApiVersions")
        self.versions = {
            int(key.api_key): (int(key.min_version), int(key.max_version))
            for key in response.api_keys
        }

    def version(self, api_key: int) -> int:
        low, high = CLIENT_VERSIONS[api_key]
        broker_low, broker_high = self.versions.get(api_key, (0, -1))
        chosen = min(high, broker_high)
        if chosen < max(low, broker_low):
            raise KafkaResponseError(
                KafkaErrorCode.UNSUPPORTED_VERSION,
                f"API key {api_key}: the client speaks v{low}-{high}, the broker at "
                f"{self.address[0]}:{self.address[1]} v{broker_low}-{broker_high}",
            )
        return chosen


class KafkaClient:
    """Blocking client for Metadata, ListOffsets and Fetch; not thread-safe; close it (or use
    it as a context manager) to drop its sockets. ``read_committed``: ListOffsets and Fetch at
    READ_COMMITTED (Kafka's ``isolation.level=read_committed``)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        client_id: str = "automq-ref-spark",
        request_timeout_s: float = 30.0,
        retries: int = 4,
        retry_backoff_s: float = 0.1,
        read_committed: bool = False,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.isolation_level = READ_COMMITTED if read_committed else READ_UNCOMMITTED
        self.client_id = client_id
        self.request_timeout_s = request_timeout_s
        self.retries = max(retries, 1)
        self.retry_backoff_s = retry_backoff_s
        self._connections: dict[tuple[str, int], _Connection] = {}
        self._brokers: dict[int, tuple[str, int]] = {}
        self._topics: dict[str, TopicMetadata] = {}

    def __enter__(self) -> KafkaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    # ------------------------------------------------------------------ connections

    def _connect(self, address: tuple[str, int]) -> _Connection:
        connection = self._connections.get(address)
        if connection is None:
            connection = _Connection(address, self.client_id, self.request_timeout_s)
            try:
                connection.negotiate()
            except BaseException:
                connection.close()
                raise
            self._connections[address] = connection
        return connection

    def _backoff(self, attempt: int) -> None:
        time.sleep(self.retry_backoff_s * (2**attempt))

    def _call(
        self, addresses: Sequence[tuple[str, int]], api_key: int, values: dict[str, Any]
    ) -> Any:
        """Send one request to the first of ``addresses`` that answers, retrying connection
        failures with backoff. The request must be safe to repeat (all of ours read only)."""
        failures: list[str] = []
        for attempt in range(self.retries):
            for address in addresses:
                try:
                    connection = self._connect(address)
                    return connection.request(api_key, connection.version(api_key), values)
                except OSError as error:
                    stale = self._connections.pop(address, None)
                    if stale is not None:
                        stale.close()
                    failures.append(f"{address[0]}:{address[1]}: {error}")
            if attempt + 1 < self.retries:
                self._backoff(attempt)
        raise KafkaConnectionError(
            f"no broker answered after {self.retries} attempts ({'; '.join(failures[-3:])})"
        )

    def _any_broker(self) -> list[tuple[str, int]]:
        known = list(self._brokers.values())
        return [*known, *(address for address in self.bootstrap if address not in known)]

    def _leader_address(self, topic: str, partition: int) -> tuple[str, int]:
        metadata = self._topics.get(topic)
        if metadata is None or partition >= len(metadata.partitions):
            metadata = self.metadata([topic])[topic]
        if partition >= len(metadata.partitions):
            raise KafkaResponseError(
                KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"Metadata lists {len(metadata.partitions)} partitions",
                topic=topic,
                partition=partition,
            )
        leader = metadata.partitions[partition].leader_id
        address = self._brokers.get(leader)
        if address is None:
            raise KafkaResponseError(
                KafkaErrorCode.LEADER_NOT_AVAILABLE,
                f"Metadata names leader {leader}, which is not among the brokers",
                topic=topic,
                partition=partition,
            )
        return address

    # --------------------------------------------------------------------- requests

    def api_versions(self) -> dict[int, tuple[int, int]]:
        """The (min, max) version per API key of the first bootstrap broker that answers."""
        failures: list[str] = []
        for attempt in range(self.retries):
            for address in self._any_broker():
                try:
                    return dict(self._connect(address).versions)
                except OSError as error:
                    failures.append(f"{address[0]}:{address[1]}: {error}")
            if attempt + 1 < self.retries:
                self._backoff(attempt)
        raise KafkaConnectionError(
            f"no broker answered after {self.retries} attempts ({'; '.join(failures[-3:])})"
        )

    def metadata(self, topics: Sequence[str] | None) -> dict[str, TopicMetadata]:
        """Partitions and leaders of ``topics`` (every topic when None). A topic that does not
        exist raises UNKNOWN_TOPIC_OR_PARTITION; topics are never auto-created."""
        values: dict[str, Any] = {
            "topics": None
            if topics is None
            else [{"name": name, "topic_id": None} for name in topics],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        }
        for attempt in range(self.retries):
            response = self._call(self._any_broker(), METADATA_KEY, values)
            self._brokers = {
                int(broker.node_id): (str(broker.host), int(broker.port))
                for broker in response.brokers
            }
            result: dict[str, TopicMetadata] = {}
            retriable: KafkaResponseError | None = None
            for topic in response.topics:
                code = int(topic.error_code)
                name = str(topic.name)
                if code == KafkaErrorCode.LEADER_NOT_AVAILABLE:
                    retriable = KafkaResponseError(code, "Metadata", topic=name)
                    continue
                if code != 0:
                    raise KafkaResponseError(code, "Metadata", topic=name)
                partitions = sorted(
                    (
                        PartitionMetadata(
                            name,
                            int(p.partition_index),
                            int(p.leader_id),
                            int(getattr(p, "leader_epoch", -1)),
                        )
                        for p in topic.partitions
                    ),
                    key=lambda p: p.partition,
                )
                topic_id = getattr(topic, "topic_id", None) or uuid.UUID(int=0)
                result[name] = self._topics[name] = TopicMetadata(name, topic_id, tuple(partitions))
            if retriable is None:
                return result
            if attempt + 1 < self.retries:
                self._backoff(attempt)
        assert retriable is not None
        raise retriable

    def list_topics(self) -> list[str]:
        """Every topic's name, sorted."""
        return sorted(self.metadata(None))

    def list_offsets(
        self, partitions: Iterable[tuple[str, int]], timestamp: int
    ) -> dict[tuple[str, int], int]:
        """The offset for ``timestamp`` (:data:`EARLIEST`, :data:`LATEST` or a time in ms) of
        each (topic, partition), asked of each partition's leader (at READ_COMMITTED, LATEST
        is the last stable offset; a broker without ListOffsets v2 cannot answer that)."""
        wanted = sorted(set(partitions))
        result: dict[tuple[str, int], int] = {}
        for attempt in range(self.retries):
            pending = [key for key in wanted if key not in result]
            if not pending:
                break
            retriable: KafkaClientError | None = None
            by_leader: dict[tuple[str, int], list[tuple[str, int]]] = {}
            for topic, partition in pending:
                try:
                    address = self._leader_address(topic, partition)
                except KafkaResponseError as error:
                    if error.code != KafkaErrorCode.LEADER_NOT_AVAILABLE:
                        raise
                    retriable = error  # a move in progress: ask Metadata again
                    continue
                by_leader.setdefault(address, []).append((topic, partition))
            for address, keys in by_leader.items():
                topics: dict[str, list[dict[str, Any]]] = {}
                for topic, partition in keys:
                    topics.setdefault(topic, []).append(
                        {"partition_index": partition, "timestamp": timestamp}
                    )
                try:
                    response = self._call_once(
                        address,
                        LIST_OFFSETS_KEY,
                        None,
                        {
                            "replica_id": -1,
                            "isolation_level": self.isolation_level,
                            "timeout": int(self.request_timeout_s * 1000),
                            "topics": [
                                {"name": name, "partitions": entries}
                                for name, entries in topics.items()
                            ],
                        },
                        min_version=_LIST_OFFSETS_FIRST_ISOLATION_VERSION
                        if self.isolation_level == READ_COMMITTED
                        else None,
                    )
                except KafkaConnectionError as error:
                    retriable = error  # the leader died or moved: ask Metadata again
                    continue
                for topic_response in response.topics:
                    name = str(topic_response.name)
                    for entry in topic_response.partitions:
                        code = int(entry.error_code)
                        index = int(entry.partition_index)
                        if code == 0:
                            result[(name, index)] = int(entry.offset)
                        elif code in _RETRIABLE:
                            retriable = KafkaResponseError(
                                code, "ListOffsets", topic=name, partition=index
                            )
                        else:
                            raise KafkaResponseError(
                                code, "ListOffsets", topic=name, partition=index
                            )
            if retriable is not None:
                if attempt + 1 == self.retries:
                    raise retriable
                self._topics.clear()
                self._backoff(attempt)
        missing = [key for key in wanted if key not in result]
        if missing:
            topic, partition = missing[0]
            raise KafkaResponseError(
                KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                "ListOffsets gave no answer",
                topic=topic,
                partition=partition,
            )
        return result

    def earliest_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return self.list_offsets(partitions, EARLIEST)

    def latest_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return self.list_offsets(partitions, LATEST)

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 16 * 1024 * 1024,
        partition_max_bytes: int = 4 * 1024 * 1024,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
    ) -> FetchResult:
        """Record bytes of one partition from ``offset``, read from its leader. An offset out
        of range raises :class:`OffsetOutOfRangeError`; any other error code
        :class:`KafkaResponseError`."""
        for attempt in range(self.retries):
            last = attempt + 1 == self.retries
            try:
                address = self._leader_address(topic, partition)
                metadata = self._topics[topic]
                version = self._connect(address).version(FETCH_KEY)
            except KafkaResponseError as error:
                if error.code != KafkaErrorCode.LEADER_NOT_AVAILABLE or last:
                    raise
                self._topics.pop(topic, None)  # a move in progress: ask Metadata again
                self._backoff(attempt)
                continue
            except OSError as error:
                if last:
                    raise KafkaConnectionError(
                        f"cannot connect to {address[0]}:{address[1]}, the leader of "
                        f"{topic}-{partition}, after {self.retries} attempts: {error}"
                    ) from error
                self._topics.pop(topic, None)  # the leader died or moved: ask Metadata again
                self._backoff(attempt)
                continue
            if version >= _FETCH_FIRST_TOPIC_ID_VERSION and metadata.topic_id.int == 0:
                version = _FETCH_FIRST_TOPIC_ID_VERSION - 1  # no topic id known: fetch by name
            fetch_partition = {
                "partition": partition,
                "current_leader_epoch": metadata.partitions[partition].leader_epoch,
                "fetch_offset": offset,
                "log_start_offset": -1,
                "partition_max_bytes": partition_max_bytes,
            }
            values: dict[str, Any] = {
                "replica_id": -1,
                "max_wait": max_wait_ms,
                "min_bytes": min_bytes,
                "max_bytes": max_bytes,
                "isolation_level": self.isolation_level,
                "session_id": 0,
                "session_epoch": -1,
                "topics": [
                    {
                        "topic": topic,
                        "topic_id": metadata.topic_id,
                        "partitions": [fetch_partition],
                    }
                ],
                "forgotten_topics_data": [],
                "rack_id": "",
            }
            try:
                response = self._call_once(address, FETCH_KEY, version, values)
            except KafkaConnectionError:
                if last:
                    raise
                self._topics.pop(topic, None)  # the leader died or moved: ask Metadata again
                self._backoff(attempt)
                continue
            code = int(response.error_code) if hasattr(response, "error_code") else 0
            data = None
            if code == 0:
                for topic_response in response.responses:
                    for entry in topic_response.partitions:
                        if int(entry.partition_index) == partition:
                            data = entry
                if data is None:
                    raise KafkaResponseError(
                        KafkaErrorCode.UNKNOWN_SERVER_ERROR,
                        "Fetch response without the partition",
                        topic=topic,
                        partition=partition,
                    )
                code = int(data.error_code)
            if code == 0 and data is not None:
                aborted = getattr(data, "aborted_transactions", None)
                return FetchResult(
                    topic,
                    partition,
                    int(data.high_watermark),
                    int(getattr(data, "log_start_offset", -1)),
                    bytes(data.records or b""),
                    int(getattr(data, "last_stable_offset", -1)),
                    None
                    if aborted is None
                    else tuple((int(a.producer_id), int(a.first_offset)) for a in aborted),
                )
            if code == KafkaErrorCode.OFFSET_OUT_OF_RANGE and data is not None:
                raise OffsetOutOfRangeError(
                    topic,
                    partition,
                    offset,
                    int(getattr(data, "log_start_offset", -1)),
                    int(data.high_watermark),
                )
            if code not in _RETRIABLE or attempt + 1 == self.retries:
                raise KafkaResponseError(code, "Fetch", topic=topic, partition=partition)
            self._topics.pop(topic, None)
            self._backoff(attempt)
        raise AssertionError("unreachable")

    def _call_once(
        self,
        address: tuple[str, int],
        api_key: int,
        version: int | None,
        values: dict[str, Any],
        *,
        min_version: int | None = None,
    ) -> Any:
        """One request to one broker (``version`` None: the highest both speak, which must be
        at least ``min_version`` when given). A connection that cannot be made or breaks is
        dropped and raised as :class:`KafkaConnectionError`: the caller, asking a partition's
        leader, refreshes metadata before trying again."""
        try:
            connection = self._connect(address)
            chosen = connection.version(api_key) if version is None else version
            if min_version is not None and chosen < min_version:
                raise KafkaResponseError(
                    KafkaErrorCode.UNSUPPORTED_VERSION,
                    f"API key {api_key}: READ_COMMITTED needs v{min_version}, the broker at "
                    f"{address[0]}:{address[1]} speaks up to v{chosen}",
                )
            return connection.request(api_key, chosen, values)
        except OSError as error:
            stale = self._connections.pop(address, None)
            if stale is not None:
                stale.close()
            raise KafkaConnectionError(
                f"request to {address[0]}:{address[1]} failed: {error}"
            ) from error
