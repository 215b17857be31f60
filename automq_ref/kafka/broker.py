"""The single-node broker: Kafka requests in, partitions over S3Storage streams underneath.

Every request is decoded with kio (unknown tagged fields skipped) and dispatched by API key. The
handlers keep one rule for ordering (see :mod:`automq_ref.kafka.server`): whatever must happen
in request order (offset assignment) happens before the handler returns; waiting (WAL sync,
Fetch long poll) happens in the returned awaitable.

What a request cannot be answered with closes the connection, as Kafka does: an unknown API key,
a version this broker does not speak (except ApiVersions, answered in v0 with UNSUPPORTED_VERSION
so the client can retry lower: KIP-511), a frame kio cannot decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from automq_ref.config import BrokerConfig
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.errors import FormatError
from automq_ref.formats.record_batch import iter_batches
from automq_ref.formats.topic_record import Topic, topics_in
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.storage.object_store import ObjectStore, open_object_store
from automq_ref.io.storage.s3stream import S3Storage, StorageError, StreamFencedError
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.kafka.groups import GroupCoordinator
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.server import Chunks, CloseConnection, Peer, Reply
from automq_ref.kafka.topics import (
    TOPIC_CONFIG_DEFAULTS,
    TopicError,
    check_topic_config,
    check_topic_name,
)
from automq_ref.protocol import (
    PRODUCE_API_KEY,
    PRODUCE_MIN_VERSION,
    FetchableTopicResponse,
    FetchPartitionData,
    decode_produce_frame,
    encode_fetch_response,
)
from automq_ref.protocol.kio_codec import (
    RequestDecodeError,
    build,
    decode_request,
    encode_response,
    peek_header,
    response_class,
)
from automq_ref.protocol.produce_response import (
    ProducePartitionAnswer,
    encode_produce_response,
)
from automq_ref.state_machines import group as gc
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import topic_key

log = logging.getLogger(__name__)

ZERO_UUID = uuid.UUID(int=0)
NAMESPACE = "_kafka_automq_ref"
PRODUCER_ID_BLOCK = 1000
PRODUCER_ID_KEY = "producer-ids/next"

# The API keys this broker answers and their version ranges: Kafka 4.0's, for the keys it
# implements (tests/unit/test_broker_api_versions.py compares them with kafka-python's table
# of real releases). Produce v0-2 are advertised, as Kafka 4.0 does for librdkafka's feature
# detection, and refused when used.
API_VERSIONS: dict[int, tuple[int, int]] = {
    0: (0, 12),  # Produce
    1: (4, 17),  # Fetch
    2: (1, 10),  # ListOffsets
    3: (0, 13),  # Metadata
    8: (2, 9),  # OffsetCommit
    9: (1, 9),  # OffsetFetch
    10: (0, 6),  # FindCoordinator
    11: (2, 9),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 6),  # DescribeGroups
    16: (0, 5),  # ListGroups
    18: (0, 4),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 5),  # InitProducerId
    23: (2, 4),  # OffsetForLeaderEpoch
    32: (1, 4),  # DescribeConfigs
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    44: (0, 1),  # IncrementalAlterConfigs
    60: (0, 2),  # DescribeCluster
}


@dataclass(frozen=True, slots=True)
class _Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


class Broker:
    def __init__(
        self,
        config: BrokerConfig,
        storage: S3Storage,
        store: ObjectStore,
        metadata_log: FileMetadataLog,
    ) -> None:
        self.config = config
        self.storage = storage
        self._store = store
        self._metadata_log = metadata_log
        self.topics: dict[str, Topic] = {}
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._topic_lock = asyncio.Lock()
        self._next_producer_id = 0
        self._producer_id_limit = 0
        self._producer_id_lock = asyncio.Lock()
        self._retention_task: asyncio.Task[None] | None = None
        self.groups: GroupCoordinator | None = None
        self.advertised_host = config.host
        self.advertised_port = config.port

    # ------------------------------------------------------------------------- lifecycle

    @classmethod
    async def start(cls, config: BrokerConfig) -> Broker:
        data_dir = config.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        metadata_log = await FileMetadataLog.open(data_dir / "metadata")
        controller = await Controller.open(metadata_log)
        node_epoch = int(time.time() * 1000)
        if config.test_discard_wal_at_start:
            log.warning("automq.ref.test.discard.wal.at.start: discarding the WAL (test only)")
            config.wal_file.unlink(missing_ok=True)
        if config.test_ack_before_fsync:
            log.warning("automq.ref.test.ack.before.fsync: WAL acks before fsync (test only)")
        wal = await BlockWal.open_file(
            config.wal_file,
            node_id=config.node_id,
            node_epoch=node_epoch,
            capacity_bytes=config.s3_wal_capacity,
            undo_journal=config.test_wal_undo_journal,
            ack_before_fsync=config.test_ack_before_fsync,
        )
        store = open_object_store(config.object_store_uri)
        await store.__aenter__()
        params = lc.LogCacheParams(
            upload_threshold_bytes=config.upload_threshold_bytes,
            upload_interval_ms=config.s3_wal_upload_interval_ms,
            stream_object_split_bytes=config.s3_stream_object_split_size,
            capacity_bytes=config.s3_wal_cache_size,
        )
        storage = await S3Storage.start(
            wal=wal,
            store=store,
            controller=controller,
            node_id=config.node_id,
            node_epoch=node_epoch,
            namespace=NAMESPACE,
            params=params,
            block_cache_bytes=config.s3_block_cache_size,
        )
        broker = cls(config, storage, store, metadata_log)
        for name, topic in sorted(topics_in(controller.image.kv).items()):
            broker.topics[name] = topic
            for index in range(topic.partitions):
                broker.partitions[(name, index)] = await Partition.open(
                    storage, name, topic.topic_id, index
                )
        broker.groups = await GroupCoordinator.open(
            storage, initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms
        )
        broker._retention_task = asyncio.create_task(broker._retention_forever())
        return broker

    async def shutdown(self) -> None:
        """Graceful: close every partition (uploading its data), then the storage."""
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(BaseException):
                await self._retention_task
        for partition in self.partitions.values():
            partition.wake_waiters()
        try:
            # Together: the first close seals the block holding everyone's data, the others
            # wait for that same upload.
            closing = [partition.close() for partition in self.partitions.values()]
            if self.groups is not None:
                closing.append(self.groups.close())
            await asyncio.gather(*closing)
            await self.storage.shutdown()
        finally:
            await self._metadata_log.close()
            await self._store.close()

    # --------------------------------------------------------------------------- dispatch

    async def admit(self, frame: bytes | bytearray, peer: Peer) -> Reply:
        # peek_header reads with struct.unpack_from: any buffer does.
        api_key, api_version, correlation_id = peek_header(cast(bytes, frame))
        if api_key == 18 and api_version > API_VERSIONS[18][1]:
            return self._api_versions_v0_unsupported(correlation_id)
        supported = API_VERSIONS.get(api_key)
        if supported is None:
            raise CloseConnection(f"unknown or unsupported API key {api_key}")
        if not supported[0] <= api_version <= supported[1]:
            raise CloseConnection(f"API key {api_key} version {api_version} is not supported")
        try:
            if api_key == PRODUCE_API_KEY and api_version >= PRODUCE_MIN_VERSION:
                # By hand: the records stay memoryview slices of the frame (no copy), writable
                # when the frame is a bytearray (the partition patches them in place).
                produce_header, body = decode_produce_frame(frame)
                client_id = produce_header.client_id
            else:
                header, body = decode_request(bytes(frame))  # bytes: no copy
                client_id = header.client_id
        except (RequestDecodeError, FormatError) as error:
            log.debug("undecodable frame: %s", frame[:256].hex())
            raise CloseConnection(f"undecodable request: {error}") from error
        request = _Request(api_key, api_version, correlation_id, client_id, body)
        handler = _HANDLERS.get(api_key)
        if handler is None:
            raise CloseConnection(f"API key {api_key} has no handler")
        return await handler(self, request)

    def _respond(self, request: _Request, values: dict[str, Any]) -> Chunks:
        cls = response_class(request.api_key, request.api_version)
        return encode_response(
            request.api_key, request.api_version, request.correlation_id, build(cls, values)
        )

    # -------------------------------------------------------------------------- ApiVersions

    def _api_versions_v0_unsupported(self, correlation_id: int) -> Chunks:
        cls = response_class(18, 0)
        values = {
            "error_code": KafkaErrorCode.UNSUPPORTED_VERSION,
            "api_keys": self._api_keys(),
        }
        return encode_response(18, 0, correlation_id, build(cls, values))

    @staticmethod
    def _api_keys() -> list[dict[str, int]]:
        return [
            {"api_key": key, "min_version": low, "max_version": high}
            for key, (low, high) in sorted(API_VERSIONS.items())
        ]

    async def _on_api_versions(self, request: _Request) -> Reply:
        return self._respond(
            request,
            {"error_code": 0, "api_keys": self._api_keys(), "throttle_time": 0},
        )

    # ----------------------------------------------------------------------------- topics

    def _topic_by_id(self, topic_id: uuid.UUID) -> Topic | None:
        for topic in self.topics.values():
            if topic.topic_id == topic_id:
                return topic
        return None

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str], validate_only: bool = False
    ) -> Topic:
        check_topic_name(name)
        if partitions < 1:
            raise TopicError(KafkaErrorCode.INVALID_PARTITIONS, f"{partitions} partitions")
        for key, value in configs.items():
            check_topic_config(key, value)
        async with self._topic_lock:
            if name in self.topics:
                raise TopicError(KafkaErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name} exists")
            topic = Topic(name, uuid.uuid4(), partitions, dict(configs))
            if validate_only:
                return topic
            for index in range(partitions):
                self.partitions[(name, index)] = await Partition.create(
                    self.storage, name, topic.topic_id, index
                )
            # The partitions' MetaStream records go to objects now rather than at the next
            # upload: a topic's skeleton then never depends on the WAL.
            await self.storage.force_upload(lc.ALL_STREAMS)
            await self._put_topic(topic)
            self.topics[name] = topic
            return topic

    async def _put_topic(self, topic: Topic) -> None:
        response = await self.storage.controller.handle(
            sm.PutKV(topic_key(topic.name), topic.encode(), True)
        )
        if not response.ok:
            raise TopicError(KafkaErrorCode.KAFKA_STORAGE_ERROR, str(response.message))

    async def delete_topic(self, name: str) -> Topic:
        async with self._topic_lock:
            topic = self.topics.get(name)
            if topic is None:
                raise TopicError(KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
            await self.storage.controller.handle(sm.DeleteKV(topic_key(name)))
            del self.topics[name]
            for index in range(topic.partitions):
                partition = self.partitions.pop((name, index))
                partition.wake_waiters()
                await partition.delete()
            return topic

    def topic_config(self, topic: Topic, name: str) -> str:
        if name in topic.configs:
            return topic.configs[name]
        default = TOPIC_CONFIG_DEFAULTS[name]
        if default is not None:
            return default
        return str(
            {
                "retention.ms": self.config.log_retention_ms,
                "retention.bytes": self.config.log_retention_bytes,
                "max.message.bytes": self.config.message_max_bytes,
            }[name]
        )

    # --------------------------------------------------------------------------- Metadata

    async def _on_metadata(self, request: _Request) -> Reply:
        body = request.body
        version = request.api_version
        auto_create = self.config.auto_create_topics_enable and (
            version < 4 or body.allow_auto_topic_creation
        )
        results: list[dict[str, Any]] = []
        if body.topics is None or (version == 0 and not body.topics):
            wanted = [(name, None) for name in sorted(self.topics)]
        else:
            wanted = [(t.name, getattr(t, "topic_id", None)) for t in body.topics]
        for name, topic_id in wanted:
            topic: Topic | None = None
            if name is None and topic_id is not None:
                topic = self._topic_by_id(topic_id)
            elif name is not None:
                topic = self.topics.get(name)
                if topic is None and auto_create:
                    try:
                        topic = await self.create_topic(name, self.config.num_partitions, {})
                    except TopicError as error:
                        if error.code is not KafkaErrorCode.TOPIC_ALREADY_EXISTS:
                            results.append(self._metadata_error(name, error.code))
                            continue
                        topic = self.topics.get(name)
            if topic is None:
                code = (
                    KafkaErrorCode.UNKNOWN_TOPIC_ID
                    if name is None
                    else KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                )
                results.append(self._metadata_error(name, code, topic_id))
                continue
            results.append(self._metadata_topic(topic))
        return self._respond(
            request,
            {
                "throttle_time": 0,
                "brokers": [self._broker_entry()],
                "cluster_id": self.config.cluster_id,
                "controller_id": self.config.node_id,
                "topics": results,
                "error_code": 0,
            },
        )

    def _broker_entry(self) -> dict[str, Any]:
        return {
            "node_id": self.config.node_id,
            "host": self.advertised_host,
            "port": self.advertised_port,
            "rack": None,
        }

    def _metadata_error(
        self, name: str | None, code: KafkaErrorCode, topic_id: uuid.UUID | None = None
    ) -> dict[str, Any]:
        return {
            "error_code": code,
            "name": name,
            "topic_id": topic_id or ZERO_UUID,
            "is_internal": False,
            "partitions": [],
            "topic_authorized_operations": -2147483648,
        }

    def _metadata_topic(self, topic: Topic) -> dict[str, Any]:
        node = self.config.node_id
        return {
            "error_code": 0,
            "name": topic.name,
            "topic_id": topic.topic_id,
            "is_internal": False,
            "partitions": [
                {
                    "error_code": 0,
                    "partition_index": index,
                    "leader_id": node,
                    "leader_epoch": self.partitions[(topic.name, index)].epoch,
                    "replica_nodes": [node],
                    "isr_nodes": [node],
                    "offline_replicas": [],
                }
                for index in range(topic.partitions)
            ],
            "topic_authorized_operations": -2147483648,
        }

    # ---------------------------------------------------------------------------- Produce

    async def _on_produce(self, request: _Request) -> Reply:
        body = request.body
        if request.api_version < 3:
            raise CloseConnection(f"Produce v{request.api_version} is not supported (v3+)")
        acks = body.acks
        outcomes: list[tuple[str, list[tuple[int, Any]]]] = []
        for topic_data in body.topic_data:
            results: list[tuple[int, Any]] = []
            for partition_data in topic_data.partition_data:
                partition = self.partitions.get((topic_data.name, partition_data.index))
                if acks not in (-1, 0, 1):
                    results.append((partition_data.index, KafkaErrorCode.INVALID_REQUIRED_ACKS))
                elif partition is None:
                    results.append(
                        (partition_data.index, KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    )
                else:
                    topic = self.topics[topic_data.name]
                    max_bytes = int(self.topic_config(topic, "max.message.bytes"))
                    try:
                        result = partition.append_nowait(partition_data.records, max_bytes)
                    except StreamFencedError:
                        # Closing (shutdown, deletion) or moved: the client refreshes and retries.
                        results.append(
                            (partition_data.index, KafkaErrorCode.NOT_LEADER_OR_FOLLOWER)
                        )
                        continue
                    except StorageError as error:
                        log.error("produce to %s: %s", partition.topic, error)
                        results.append((partition_data.index, KafkaErrorCode.KAFKA_STORAGE_ERROR))
                        continue
                    results.append((partition_data.index, (partition, result)))
            outcomes.append((topic_data.name, results))
        if acks == 0:
            return None
        return self._produce_response(request, outcomes)

    async def _produce_response(
        self, request: _Request, outcomes: list[tuple[str, list[tuple[int, Any]]]]
    ) -> Chunks:
        topics: list[tuple[str, list[ProducePartitionAnswer]]] = []
        for name, results in outcomes:
            answers = []
            for index, outcome in results:
                if isinstance(outcome, KafkaErrorCode):
                    answers.append(ProducePartitionAnswer(index, outcome.value))
                    continue
                partition, result = outcome
                code = result.error
                if code is KafkaErrorCode.NONE and result.durable is not None:
                    try:
                        await result.durable
                    except StorageError as error:
                        log.error("produce to %s: %s", name, error)
                        code = KafkaErrorCode.KAFKA_STORAGE_ERROR
                if code is not KafkaErrorCode.NONE:
                    answers.append(
                        ProducePartitionAnswer(index, code.value, -1, -1, -1, result.message)
                    )
                    continue
                try:
                    log_start = partition.log_start_offset
                except StorageError:
                    log_start = -1
                answers.append(ProducePartitionAnswer(index, 0, result.base_offset, -1, log_start))
            topics.append((name, answers))
        # By hand: the busiest response; kio's dataclasses cost a tenth of the loop at 1,000/s.
        return [encode_produce_response(request.api_version, request.correlation_id, topics)]

    # ------------------------------------------------------------------------------ Fetch

    async def _on_fetch(self, request: _Request) -> Reply:
        return self._fetch(request)

    async def _fetch(self, request: _Request) -> Chunks:
        body = request.body
        version = request.api_version
        by_id = version >= 13
        max_wait_s = max(body.max_wait.total_seconds(), 0.0)
        deadline = time.monotonic() + max_wait_s
        wanted: list[tuple[Any, str | None, list[Any]]] = []
        for fetch_topic in body.topics:
            if by_id:
                topic = self._topic_by_id(fetch_topic.topic_id)
                name = topic.name if topic is not None else None
                key = fetch_topic.topic_id
            else:
                name = fetch_topic.topic
                key = name
            wanted.append((key, name, list(fetch_topic.partitions)))
        while True:
            responses, total, waits, errors = await self._fetch_once(body, wanted, by_id)
            remaining = deadline - time.monotonic()
            if total >= int(body.min_bytes) or remaining <= 0 or errors or not waits:
                break
            waiting = [asyncio.ensure_future(partition.wait_for_data()) for partition in waits]
            done, pending = await asyncio.wait(
                waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            for future in pending:
                future.cancel()
            if not done:
                responses, total, waits, errors = await self._fetch_once(body, wanted, by_id)
                break
        chunks = encode_fetch_response(version, request.correlation_id, responses)
        # The encoder's first chunk starts with the frame size; the listener writes its own.
        return [memoryview(chunks[0])[4:], *chunks[1:]]

    async def _fetch_once(
        self, body: Any, wanted: list[tuple[Any, str | None, list[Any]]], by_id: bool
    ) -> tuple[list[FetchableTopicResponse], int, list[Partition], bool]:
        budget = int(body.max_bytes)
        total = 0
        waits: list[Partition] = []
        errors = False
        responses = []
        for key, name, fetch_partitions in wanted:
            partitions: list[FetchPartitionData] = []
            for fetch_partition in fetch_partitions:
                index = int(fetch_partition.partition)
                partition = self.partitions.get((name, index)) if name is not None else None
                if partition is None:
                    code = (
                        KafkaErrorCode.UNKNOWN_TOPIC_ID
                        if by_id and name is None
                        else KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    )
                    errors = True
                    partitions.append(FetchPartitionData(partition_index=index, error_code=code))
                    continue
                code, chunks = await self._read_partition(
                    partition, fetch_partition, budget, first=(total == 0)
                )
                if code is not KafkaErrorCode.NONE:
                    errors = True
                size = sum(len(chunk) for chunk in chunks)
                total += size
                budget -= size
                if not chunks:
                    waits.append(partition)
                high_watermark = partition.high_watermark
                partitions.append(
                    FetchPartitionData(
                        partition_index=index,
                        error_code=code,
                        high_watermark=high_watermark,
                        last_stable_offset=high_watermark,
                        log_start_offset=partition.log_start_offset,
                        records=chunks,
                    )
                )
            if by_id:
                responses.append(FetchableTopicResponse(partitions=partitions, topic_id=key))
            else:
                responses.append(FetchableTopicResponse(partitions=partitions, topic=key))
        return responses, total, waits, errors

    async def _read_partition(
        self, partition: Partition, fetch_partition: Any, budget: int, first: bool
    ) -> tuple[KafkaErrorCode, list[bytes | memoryview]]:
        leader_epoch = int(getattr(fetch_partition, "current_leader_epoch", -1))
        if leader_epoch >= 0 and leader_epoch != partition.epoch:
            code = (
                KafkaErrorCode.FENCED_LEADER_EPOCH
                if leader_epoch < partition.epoch
                else KafkaErrorCode.UNKNOWN_LEADER_EPOCH
            )
            return code, []
        offset = int(fetch_partition.fetch_offset)
        if offset < partition.log_start_offset or offset > partition.log_end_offset:
            return KafkaErrorCode.OFFSET_OUT_OF_RANGE, []
        limit = min(int(fetch_partition.partition_max_bytes), budget)
        if limit <= 0 and not first:
            return KafkaErrorCode.NONE, []
        try:
            return KafkaErrorCode.NONE, await partition.read(offset, max(limit, 1))
        except StorageError as error:
            log.error("fetch from %s-%d: %s", partition.topic, partition.index, error)
            return KafkaErrorCode.KAFKA_STORAGE_ERROR, []

    # ------------------------------------------------------------------------ ListOffsets

    async def _on_list_offsets(self, request: _Request) -> Reply:
        topics = []
        for list_topic in request.body.topics:
            partitions = []
            for list_partition in list_topic.partitions:
                index = int(list_partition.partition_index)
                entry: dict[str, Any] = {
                    "partition_index": index,
                    "error_code": 0,
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": -1,
                }
                partition = self.partitions.get((list_topic.name, index))
                if partition is None:
                    entry["error_code"] = KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    entry["leader_epoch"] = partition.epoch
                    offset, timestamp = await self._list_offset(
                        partition, int(list_partition.timestamp)
                    )
                    entry["offset"] = offset
                    entry["timestamp"] = timestamp
                partitions.append(entry)
            topics.append({"name": list_topic.name, "partitions": partitions})
        return self._respond(request, {"throttle_time": 0, "topics": topics})

    async def _list_offset(self, partition: Partition, timestamp: int) -> tuple[int, int]:
        if timestamp in (-2, -4, -5):  # earliest; earliest local; earliest tiered
            return partition.log_start_offset, -1
        if timestamp == -1:  # latest
            return partition.high_watermark, -1
        if timestamp == -3:  # the record with the largest timestamp
            found = partition.max_timestamp_offset()
            if found is None:
                return -1, -1
            batch_last, max_timestamp = found
            return await self._record_at_timestamp(partition, batch_last, max_timestamp, exact=True)
        located = partition.offset_for_timestamp(timestamp)
        if located is None:
            return -1, -1
        batch_offset, _ = located
        return await self._record_at_timestamp(partition, batch_offset, timestamp, exact=False)

    async def _record_at_timestamp(
        self, partition: Partition, offset: int, timestamp: int, *, exact: bool
    ) -> tuple[int, int]:
        """The first record of the batch at ``offset`` whose timestamp is >= (or, ``exact``,
        ==) ``timestamp``."""
        chunks = await partition.read(offset, 1)
        for chunk in chunks:
            for view in iter_batches(chunk, verify_crc=False):
                for record in view.records():
                    if record.offset < partition.log_start_offset:
                        continue
                    if (
                        (record.timestamp == timestamp)
                        if exact
                        else (record.timestamp >= timestamp)
                    ):
                        return record.offset, record.timestamp
        return -1, -1

    # -------------------------------------------------------------- OffsetForLeaderEpoch

    async def _on_offset_for_leader_epoch(self, request: _Request) -> Reply:
        topics = []
        for topic in request.body.topics:
            partitions = []
            for asked in topic.partitions:
                index = int(asked.partition)
                partition = self.partitions.get((topic.topic, index))
                entry: dict[str, Any] = {
                    "error_code": 0,
                    "partition": index,
                    "leader_epoch": -1,
                    "end_offset": -1,
                }
                if partition is None:
                    entry["error_code"] = KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif 0 <= int(asked.current_leader_epoch) < partition.epoch:
                    entry["error_code"] = KafkaErrorCode.FENCED_LEADER_EPOCH
                elif int(asked.current_leader_epoch) > partition.epoch:
                    entry["error_code"] = KafkaErrorCode.UNKNOWN_LEADER_EPOCH
                else:
                    epoch, end = partition.end_offset_for_epoch(int(asked.leader_epoch))
                    entry["leader_epoch"] = epoch
                    entry["end_offset"] = end
                partitions.append(entry)
            topics.append({"topic": topic.topic, "partitions": partitions})
        return self._respond(request, {"throttle_time": 0, "topics": topics})

    # ------------------------------------------------------------------ topic admin APIs

    async def _on_create_topics(self, request: _Request) -> Reply:
        body = request.body
        results = []
        for creatable in body.topics:
            result: dict[str, Any] = {
                "name": creatable.name,
                "topic_id": ZERO_UUID,
                "error_code": 0,
                "error_message": None,
                "topic_config_error_code": 0,
                "num_partitions": -1,
                "replication_factor": -1,
                "configs": [],
            }
            try:
                replication = int(creatable.replication_factor)
                if replication not in (-1, 1):
                    raise TopicError(
                        KafkaErrorCode.INVALID_REPLICATION_FACTOR,
                        f"replication factor {replication}: this broker keeps one copy in "
                        "shared storage (use 1 or -1)",
                    )
                if creatable.assignments:
                    raise TopicError(
                        KafkaErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        "manual replica assignment is not supported",
                    )
                count = int(creatable.num_partitions)
                count = self.config.num_partitions if count == -1 else count
                configs = {config.name: config.value for config in creatable.configs}
                if any(value is None for value in configs.values()):
                    raise TopicError(KafkaErrorCode.INVALID_CONFIG, "a config without a value")
                topic = await self.create_topic(
                    creatable.name,
                    count,
                    {k: v for k, v in configs.items() if v is not None},
                    bool(body.validate_only),
                )
                result["topic_id"] = topic.topic_id
                result["num_partitions"] = topic.partitions
                result["replication_factor"] = 1
                result["configs"] = [
                    {
                        "name": name,
                        "value": self.topic_config(topic, name),
                        "read_only": False,
                        "config_source": 1 if name in topic.configs else 5,
                        "is_sensitive": False,
                    }
                    for name in sorted(TOPIC_CONFIG_DEFAULTS)
                ]
            except TopicError as error:
                result["error_code"] = error.code
                result["error_message"] = str(error)
            results.append(result)
        return self._respond(request, {"throttle_time": 0, "topics": results})

    async def _on_delete_topics(self, request: _Request) -> Reply:
        body = request.body
        if request.api_version >= 6:
            wanted = [(state.name, state.topic_id) for state in body.topics]
        else:
            wanted = [(name, None) for name in body.topic_names]
        results = []
        for name, topic_id in wanted:
            result: dict[str, Any] = {
                "name": name,
                "topic_id": topic_id or ZERO_UUID,
                "error_code": 0,
                "error_message": None,
            }
            if name is None and topic_id is not None:
                found = self._topic_by_id(topic_id)
                name = found.name if found is not None else None
            try:
                if name is None:
                    raise TopicError(KafkaErrorCode.UNKNOWN_TOPIC_ID, f"no topic {topic_id}")
                topic = await self.delete_topic(name)
                result["name"] = name
                result["topic_id"] = topic.topic_id
            except TopicError as error:
                result["error_code"] = error.code
                result["error_message"] = str(error)
            results.append(result)
        return self._respond(request, {"throttle_time": 0, "responses": results})

    async def _on_create_partitions(self, request: _Request) -> Reply:
        body = request.body
        results = []
        for asked in body.topics:
            result: dict[str, Any] = {"name": asked.name, "error_code": 0, "error_message": None}
            try:
                async with self._topic_lock:
                    topic = self.topics.get(asked.name)
                    if topic is None:
                        raise TopicError(
                            KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {asked.name}"
                        )
                    count = int(asked.count)
                    if count <= topic.partitions:
                        raise TopicError(
                            KafkaErrorCode.INVALID_PARTITIONS,
                            f"topic {asked.name} has {topic.partitions} partitions; "
                            f"{count} would not add any",
                        )
                    if asked.assignments:
                        raise TopicError(
                            KafkaErrorCode.INVALID_REPLICA_ASSIGNMENT,
                            "manual replica assignment is not supported",
                        )
                    if not body.validate_only:
                        for index in range(topic.partitions, count):
                            self.partitions[(topic.name, index)] = await Partition.create(
                                self.storage, topic.name, topic.topic_id, index
                            )
                        grown = Topic(topic.name, topic.topic_id, count, topic.configs)
                        await self._put_topic(grown)
                        self.topics[topic.name] = grown
            except TopicError as error:
                result["error_code"] = error.code
                result["error_message"] = str(error)
            results.append(result)
        return self._respond(request, {"throttle_time": 0, "results": results})

    async def _on_describe_configs(self, request: _Request) -> Reply:
        results = []
        for resource in request.body.resources:
            result: dict[str, Any] = {
                "error_code": 0,
                "error_message": None,
                "resource_type": resource.resource_type,
                "resource_name": resource.resource_name,
                "configs": [],
            }
            keys = resource.configuration_keys
            if int(resource.resource_type) == 2:  # topic
                topic = self.topics.get(resource.resource_name)
                if topic is None:
                    result["error_code"] = KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    result["error_message"] = f"no topic {resource.resource_name}"
                else:
                    result["configs"] = [
                        self._config_entry(
                            name, self.topic_config(topic, name), name in topic.configs
                        )
                        for name in sorted(TOPIC_CONFIG_DEFAULTS)
                        if keys is None or name in keys
                    ]
            elif int(resource.resource_type) == 4:  # broker
                values = self.config.model_dump(by_alias=True)
                result["configs"] = [
                    self._config_entry(name, str(value), False, read_only=True)
                    for name, value in sorted(values.items())
                    if keys is None or name in keys
                ]
            else:
                result["error_code"] = KafkaErrorCode.INVALID_REQUEST
                result["error_message"] = f"resource type {resource.resource_type} is not supported"
            results.append(result)
        return self._respond(request, {"throttle_time": 0, "results": results})

    @staticmethod
    def _config_entry(
        name: str, value: str, explicit: bool, *, read_only: bool = False
    ) -> dict[str, Any]:
        return {
            "name": name,
            "value": value,
            "read_only": read_only,
            "config_source": 1 if explicit else 5,  # DYNAMIC_TOPIC_CONFIG / DEFAULT_CONFIG
            "is_default": not explicit,
            "is_sensitive": False,
            "synonyms": [],
            "config_type": 0,
            "documentation": None,
        }

    async def _on_incremental_alter_configs(self, request: _Request) -> Reply:
        body = request.body
        responses = []
        for resource in body.resources:
            response: dict[str, Any] = {
                "error_code": 0,
                "error_message": None,
                "resource_type": resource.resource_type,
                "resource_name": resource.resource_name,
            }
            try:
                if int(resource.resource_type) != 2:
                    raise TopicError(
                        KafkaErrorCode.INVALID_REQUEST, "only topic configs can be altered"
                    )
                async with self._topic_lock:
                    topic = self.topics.get(resource.resource_name)
                    if topic is None:
                        raise TopicError(
                            KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            f"no topic {resource.resource_name}",
                        )
                    configs = dict(topic.configs)
                    for change in resource.configs:
                        operation = int(change.config_operation)
                        if operation == 0:  # SET
                            check_topic_config(change.name, change.value)
                            if change.value is None:
                                raise TopicError(KafkaErrorCode.INVALID_CONFIG, "SET without value")
                            configs[change.name] = change.value
                        elif operation == 1:  # DELETE
                            check_topic_config(change.name, None)
                            configs.pop(change.name, None)
                        else:
                            raise TopicError(
                                KafkaErrorCode.INVALID_CONFIG,
                                f"{change.name}: APPEND/SUBTRACT apply to list configs only",
                            )
                    if not body.validate_only:
                        altered = Topic(topic.name, topic.topic_id, topic.partitions, configs)
                        await self._put_topic(altered)
                        self.topics[topic.name] = altered
            except TopicError as error:
                response["error_code"] = error.code
                response["error_message"] = str(error)
            responses.append(response)
        return self._respond(request, {"throttle_time": 0, "responses": responses})

    async def _on_describe_cluster(self, request: _Request) -> Reply:
        return self._respond(
            request,
            {
                "throttle_time": 0,
                "error_code": 0,
                "error_message": None,
                "endpoint_type": 1,
                "cluster_id": self.config.cluster_id,
                "controller_id": self.config.node_id,
                "brokers": [
                    {
                        "broker_id": self.config.node_id,
                        "host": self.advertised_host,
                        "port": self.advertised_port,
                        "rack": None,
                        "is_fenced": False,
                    }
                ],
                "cluster_authorized_operations": -2147483648,
            },
        )

    async def _on_delete_records(self, request: _Request) -> Reply:
        topics = []
        for topic in request.body.topics:
            partitions = []
            for asked in topic.partitions:
                index = int(asked.partition_index)
                entry: dict[str, Any] = {
                    "partition_index": index,
                    "low_watermark": -1,
                    "error_code": 0,
                }
                partition = self.partitions.get((topic.name, index))
                if partition is None:
                    entry["error_code"] = KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    offset = int(asked.offset)
                    offset = partition.high_watermark if offset == -1 else offset
                    if offset < 0 or offset > partition.high_watermark:
                        entry["error_code"] = KafkaErrorCode.OFFSET_OUT_OF_RANGE
                    else:
                        if offset > partition.log_start_offset:
                            await partition.trim(offset)
                        entry["low_watermark"] = partition.log_start_offset
                partitions.append(entry)
            topics.append({"name": topic.name, "partitions": partitions})
        return self._respond(request, {"throttle_time": 0, "topics": topics})

    # ------------------------------------------------------------------ consumer groups

    async def _on_find_coordinator(self, request: _Request) -> Reply:
        body = request.body
        node = {
            "node_id": self.config.node_id,
            "host": self.advertised_host,
            "port": self.advertised_port,
        }
        key_type = int(body.key_type) if request.api_version >= 1 else 0
        error = KafkaErrorCode.NONE
        message = None
        if key_type != 0:
            # Transactions are not supported, so there is no transaction coordinator.
            error = KafkaErrorCode.COORDINATOR_NOT_AVAILABLE
            message = "this broker has no transaction coordinator"
        if request.api_version >= 4:
            coordinators = [
                {"key": key, **node, "error_code": error, "error_message": message}
                for key in body.coordinator_keys
            ]
            return self._respond(request, {"throttle_time": 0, "coordinators": coordinators})
        if error is not KafkaErrorCode.NONE:
            node = {"node_id": -1, "host": "", "port": -1}
        return self._respond(
            request, {"throttle_time": 0, "error_code": error, "error_message": message, **node}
        )

    async def _group(self, make_event: Callable[[int, int], gc.GroupEvent]) -> gc.Response:
        assert self.groups is not None
        return await self.groups.request(make_event)

    async def _on_join_group(self, request: _Request) -> Reply:
        body = request.body
        version = request.api_version
        session_ms = int(body.session_timeout.total_seconds() * 1000)
        rebalance_ms = (
            int(body.rebalance_timeout.total_seconds() * 1000) if version >= 1 else session_ms
        )
        protocols = tuple(gc.Protocol(p.name, bytes(p.metadata)) for p in body.protocols)

        async def answer() -> Chunks:
            response = await self._group(
                lambda request_id, now: gc.JoinGroup(
                    request_id,
                    now,
                    body.group_id,
                    body.member_id,
                    getattr(body, "group_instance_id", None),
                    request.client_id or "",
                    "/127.0.0.1",
                    session_ms,
                    rebalance_ms,
                    body.protocol_type,
                    protocols,
                    version >= 4,
                )
            )
            assert isinstance(response, gc.JoinGroupResponse)
            return self._respond(
                request,
                {
                    "throttle_time": 0,
                    "error_code": response.error_code,
                    "generation_id": response.generation_id,
                    "protocol_type": response.protocol_type,
                    "protocol_name": response.protocol_name or ("" if version < 7 else None),
                    "leader": response.leader,
                    "skip_assignment": False,
                    "member_id": response.member_id,
                    "members": [
                        {
                            "member_id": m.member_id,
                            "group_instance_id": m.group_instance_id,
                            "metadata": m.metadata,
                        }
                        for m in response.members
                    ],
                },
            )

        return answer()

    async def _on_sync_group(self, request: _Request) -> Reply:
        body = request.body
        assignments = tuple(
            gc.MemberAssignment(a.member_id, bytes(a.assignment)) for a in body.assignments
        )

        async def answer() -> Chunks:
            response = await self._group(
                lambda request_id, now: gc.SyncGroup(
                    request_id,
                    now,
                    body.group_id,
                    int(body.generation_id),
                    body.member_id,
                    getattr(body, "group_instance_id", None),
                    assignments,
                    getattr(body, "protocol_type", None),
                    getattr(body, "protocol_name", None),
                )
            )
            assert isinstance(response, gc.SyncGroupResponse)
            return self._respond(
                request,
                {
                    "throttle_time": 0,
                    "error_code": response.error_code,
                    "protocol_type": response.protocol_type,
                    "protocol_name": response.protocol_name,
                    "assignment": response.assignment,
                },
            )

        return answer()

    async def _on_heartbeat(self, request: _Request) -> Reply:
        body = request.body
        response = await self._group(
            lambda request_id, now: gc.Heartbeat(
                request_id,
                now,
                body.group_id,
                int(body.generation_id),
                body.member_id,
                getattr(body, "group_instance_id", None),
            )
        )
        assert isinstance(response, gc.HeartbeatResponse)
        return self._respond(request, {"throttle_time": 0, "error_code": response.error_code})

    async def _on_leave_group(self, request: _Request) -> Reply:
        body = request.body
        if request.api_version >= 3:
            members = tuple(
                gc.LeavingMember(m.member_id, m.group_instance_id) for m in body.members
            )
        else:
            members = (gc.LeavingMember(body.member_id),)
        response = await self._group(
            lambda request_id, now: gc.LeaveGroup(request_id, now, body.group_id, members)
        )
        assert isinstance(response, gc.LeaveGroupResponse)
        error = response.error_code
        if request.api_version < 3 and error is KafkaErrorCode.NONE and response.members:
            error = response.members[0].error_code
        return self._respond(
            request,
            {
                "throttle_time": 0,
                "error_code": error,
                "members": [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.group_instance_id,
                        "error_code": m.error_code,
                    }
                    for m in response.members
                ],
            },
        )

    async def _on_offset_commit(self, request: _Request) -> Reply:
        body = request.body
        unknown: list[tuple[str, int]] = []
        entries: list[gc.OffsetCommitEntry] = []
        for topic in body.topics:
            for p in topic.partitions:
                index = int(p.partition_index)
                if (topic.name, index) not in self.partitions:
                    unknown.append((topic.name, index))
                    continue
                entries.append(
                    gc.OffsetCommitEntry(
                        topic.name,
                        index,
                        int(p.committed_offset),
                        int(getattr(p, "committed_leader_epoch", -1)),
                        p.committed_metadata or "",
                    )
                )

        async def answer() -> Chunks:
            results: list[tuple[str, int, KafkaErrorCode]] = [
                (name, index, KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION) for name, index in unknown
            ]
            if entries:
                response = await self._group(
                    lambda request_id, now: gc.OffsetCommit(
                        request_id,
                        now,
                        body.group_id,
                        int(body.generation_id_or_member_epoch),
                        body.member_id,
                        getattr(body, "group_instance_id", None),
                        tuple(entries),
                    )
                )
                assert isinstance(response, gc.OffsetCommitResponse)
                results += [(r.topic, r.partition, r.error_code) for r in response.partitions]
            by_topic: dict[str, list[dict[str, Any]]] = {}
            for name, index, error in results:
                by_topic.setdefault(name, []).append(
                    {"partition_index": index, "error_code": error}
                )
            topics = [{"name": name, "partitions": parts} for name, parts in by_topic.items()]
            return self._respond(request, {"throttle_time": 0, "topics": topics})

        return answer()

    async def _on_offset_fetch(self, request: _Request) -> Reply:
        body = request.body

        def wanted(topics: Any) -> tuple[tuple[str, int], ...] | None:
            if topics is None:
                return None
            return tuple((t.name, int(i)) for t in topics for i in t.partition_indexes)

        if request.api_version >= 8:
            groups = tuple(gc.OffsetFetchGroup(g.group_id, wanted(g.topics)) for g in body.groups)
        else:
            groups = (gc.OffsetFetchGroup(body.group_id, wanted(body.topics)),)
        response = await self._group(
            lambda request_id, now: gc.OffsetFetch(request_id, now, groups)
        )
        assert isinstance(response, gc.OffsetFetchResponse)

        def topics_of(result: gc.OffsetFetchGroupResult) -> list[dict[str, Any]]:
            by_topic: dict[str, list[dict[str, Any]]] = {}
            for p in result.partitions:
                by_topic.setdefault(p.topic, []).append(
                    {
                        "partition_index": p.partition,
                        "committed_offset": p.offset,
                        "committed_leader_epoch": p.leader_epoch,
                        "metadata": p.metadata,
                        "error_code": p.error_code,
                    }
                )
            return [{"name": name, "partitions": parts} for name, parts in by_topic.items()]

        if request.api_version >= 8:
            return self._respond(
                request,
                {
                    "throttle_time": 0,
                    "groups": [
                        {"group_id": g.group_id, "topics": topics_of(g), "error_code": g.error_code}
                        for g in response.groups
                    ],
                },
            )
        first = response.groups[0]
        return self._respond(
            request,
            {"throttle_time": 0, "topics": topics_of(first), "error_code": first.error_code},
        )

    async def _on_list_groups(self, request: _Request) -> Reply:
        body = request.body
        states = tuple(getattr(body, "states_filter", ()) or ())
        types = tuple(getattr(body, "types_filter", ()) or ())
        response = await self._group(
            lambda request_id, now: gc.ListGroups(request_id, now, states, types)
        )
        assert isinstance(response, gc.ListGroupsResponse)
        return self._respond(
            request,
            {
                "throttle_time": 0,
                "error_code": response.error_code,
                "groups": [
                    {
                        "group_id": g.group_id,
                        "protocol_type": g.protocol_type,
                        "group_state": g.group_state,
                        "group_type": g.group_type,
                    }
                    for g in response.groups
                ],
            },
        )

    async def _on_describe_groups(self, request: _Request) -> Reply:
        body = request.body
        group_ids = tuple(body.groups)
        response = await self._group(
            lambda request_id, now: gc.DescribeGroups(request_id, now, group_ids)
        )
        assert isinstance(response, gc.DescribeGroupsResponse)
        described = []
        for g in response.groups:
            error = g.error_code
            if request.api_version < 6 and error is KafkaErrorCode.GROUP_ID_NOT_FOUND:
                error = KafkaErrorCode.NONE  # before v6 an unknown group is "Dead", no error
            described.append(
                {
                    "error_code": error,
                    "error_message": None,
                    "group_id": g.group_id,
                    "group_state": g.group_state,
                    "protocol_type": g.protocol_type,
                    "protocol_data": g.protocol_data,
                    "members": [
                        {
                            "member_id": m.member_id,
                            "group_instance_id": m.group_instance_id,
                            "client_id": m.client_id,
                            "client_host": m.client_host,
                            "member_metadata": m.member_metadata,
                            "member_assignment": m.member_assignment,
                        }
                        for m in g.members
                    ],
                    "authorized_operations": -2147483648,
                }
            )
        return self._respond(request, {"throttle_time": 0, "groups": described})

    async def _on_delete_groups(self, request: _Request) -> Reply:
        body = request.body
        group_ids = tuple(body.groups_names)

        async def answer() -> Chunks:
            response = await self._group(
                lambda request_id, now: gc.DeleteGroups(request_id, now, group_ids)
            )
            assert isinstance(response, gc.DeleteGroupsResponse)
            return self._respond(
                request,
                {
                    "throttle_time": 0,
                    "results": [
                        {"group_id": r.group_id, "error_code": r.error_code}
                        for r in response.results
                    ],
                },
            )

        return answer()

    # -------------------------------------------------------------------- InitProducerId

    async def _on_init_producer_id(self, request: _Request) -> Reply:
        body = request.body
        values: dict[str, Any] = {"throttle_time": 0, "producer_id": -1, "producer_epoch": -1}
        if body.transactional_id is not None:
            values["error_code"] = KafkaErrorCode.TRANSACTIONAL_ID_NOT_FOUND
            return self._respond(request, values)
        producer_id = int(getattr(body, "producer_id", -1))
        epoch = int(getattr(body, "producer_epoch", -1))
        if producer_id >= 0 and 0 <= epoch < 32767:
            values.update(error_code=0, producer_id=producer_id, producer_epoch=epoch + 1)
        else:
            values.update(error_code=0, producer_id=await self._allocate_producer_id())
            values["producer_epoch"] = 0
        return self._respond(request, values)

    async def _allocate_producer_id(self) -> int:
        # One at a time: two InitProducerId requests that both found the block used up would
        # otherwise both take the new block's first id (the history checker caught two
        # producers sharing an id, the second one's batches answered as duplicates).
        async with self._producer_id_lock:
            return await self._allocate_producer_id_locked()

    async def _allocate_producer_id_locked(self) -> int:
        if self._next_producer_id >= self._producer_id_limit:
            controller = self.storage.controller
            current = controller.image.kv.get(PRODUCER_ID_KEY)
            start = int(current) if current is not None else 0
            limit = start + PRODUCER_ID_BLOCK
            response = await controller.handle(sm.PutKV(PRODUCER_ID_KEY, str(limit).encode(), True))
            if not response.ok:
                raise CloseConnection(f"cannot allocate producer ids: {response.message}")
            self._next_producer_id, self._producer_id_limit = start, limit
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        return producer_id

    # ------------------------------------------------------------------------- retention

    async def _retention_forever(self) -> None:
        interval_s = self.config.log_retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.enforce_retention(int(time.time() * 1000))
            except Exception:
                log.exception("retention round failed; the next round retries")

    async def enforce_retention(self, now_ms: int) -> int:
        """Trim every partition to what its topic's retention allows; return offsets dropped."""
        dropped = 0
        for (name, _), partition in list(self.partitions.items()):
            topic = self.topics.get(name)
            if topic is None:
                continue
            retention_ms = int(self.topic_config(topic, "retention.ms"))
            retention_bytes = int(self.topic_config(topic, "retention.bytes"))
            start = partition.log_start_offset
            new_start = partition.retention_trim_point(now_ms, retention_ms, retention_bytes)
            if new_start > start:
                await partition.trim(new_start)
                dropped += new_start - start
        return dropped


_HANDLERS: dict[int, Callable[[Broker, _Request], Awaitable[Reply]]] = {
    0: Broker._on_produce,
    8: Broker._on_offset_commit,
    9: Broker._on_offset_fetch,
    10: Broker._on_find_coordinator,
    11: Broker._on_join_group,
    12: Broker._on_heartbeat,
    13: Broker._on_leave_group,
    14: Broker._on_sync_group,
    15: Broker._on_describe_groups,
    16: Broker._on_list_groups,
    42: Broker._on_delete_groups,
    1: Broker._on_fetch,
    2: Broker._on_list_offsets,
    3: Broker._on_metadata,
    18: Broker._on_api_versions,
    19: Broker._on_create_topics,
    20: Broker._on_delete_topics,
    21: Broker._on_delete_records,
    22: Broker._on_init_producer_id,
    23: Broker._on_offset_for_leader_epoch,
    32: Broker._on_describe_configs,
    37: Broker._on_create_partitions,
    44: Broker._on_incremental_alter_configs,
    60: Broker._on_describe_cluster,
}
