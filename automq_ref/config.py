"""Broker settings, by AutoMQ's (and Kafka's) property names where they exist.

Sources, later ones winning: the defaults below (the *embedded default*: everything local under
``./data``, listening on 127.0.0.1:9092), a Java-style properties file (``--config``),
environment variables (``AUTOMQ_`` + the name upper-cased with dots as underscores, e.g.
``AUTOMQ_S3_DATA_BUCKETS``) and ``--override name=value`` flags. Every problem is refused as one
line naming the property and what is wrong (an unknown name with the nearest known one), so the
command line can print them as they are.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from automq_ref.formats.listeners import (
    DEFAULT_SECURITY_PROTOCOL_MAP,
    SSL_CLIENT_AUTH,
    Listener,
    is_listener_setting,
    listener_setting,
    parse_listeners,
    parse_protocol_map,
    resolve_listeners,
)
from automq_ref.state_machines.acl import AuthorizerSettings

MIB = 1024 * 1024

# The object WAL's query parameters in ``s3.wal.path`` (AutoMQ's names) and their defaults.
OBJECT_WAL_PARAMETERS: Mapping[str, int] = {
    "batchInterval": 250,
    "maxBytesInBatch": 8 * MIB,
    "maxUnflushedBytes": 1024 * MIB,
    "maxInflightUploadCount": 50,
    "readaheadDataSize": 100 * MIB,
}
# Query parameters of the bucket itself, passed on to the object store.
_BUCKET_PARAMETERS = frozenset({"region", "endpoint", "pathStyle", "accessKey", "secretKey"})


@dataclass(frozen=True, slots=True)
class ObjectWalSettings:
    """The object WAL ``s3.wal.path`` names: where its objects go (an object store URI, S3 or a
    local directory) and AutoMQ's batching parameters."""

    store_uri: str
    batch_interval_ms: int
    max_bytes_in_batch: int
    max_unflushed_bytes: int
    max_inflight_uploads: int
    readahead_bytes: int


def _split_wal_path(raw: str) -> tuple[str, str, str]:
    """``(scheme, location, query)`` of ``s3.wal.path``: AutoMQ's ``<id>@<scheme>://...``, or a
    plain path (scheme ``""``)."""
    raw = raw.strip()
    head = raw.split("/", 1)[0]
    if "@" in head:
        raw = raw.split("@", 1)[1]
    scheme, separator, rest = raw.partition("://")
    if not separator:
        return "", raw, ""
    location, _, query = rest.partition("?")
    return scheme, location, query


def _wal_device_address(raw: str) -> str | None:
    """The WAL device process a ``device://`` path names (``HOST:PORT``, or a Unix socket's
    path for ``device:///PATH``); None for the other schemes. Raises ValueError naming what is
    wrong."""
    scheme, location, query = _split_wal_path(raw)
    if scheme != "device":
        return None
    if query:
        raise ValueError(f"a device:// WAL takes no parameters, not {query!r}")
    if location.startswith("/"):
        return location
    host, separator, port = location.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"a device:// WAL needs HOST:PORT or a socket path: 0@device://127.0.0.1:PORT or "
            f"0@device:///PATH, not {location!r}"
        )
    return location


# AutoMQ's metrics exporter URI: the Prometheus exporter's scheme and the port it takes when the
# URI names none.
METRICS_EXPORTER_SCHEME = "prometheus"
METRICS_EXPORTER_DEFAULT_PORT = 9090


@dataclass(frozen=True, slots=True)
class ExporterAddress:
    """Where the Prometheus endpoint listens."""

    host: str
    port: int


def parse_exporter_uri(raw: str) -> ExporterAddress | None:
    """``s3.telemetry.metrics.exporter.uri``: AutoMQ's list of exporter URIs, comma-separated;
    blank, none. ``prometheus://?host=H&port=P`` (or ``prometheus://H:P``) serves the endpoint
    on ``H:P``, with AutoMQ's defaults, host ``localhost`` and port 9090, for what it does not
    name. AutoMQ's other exporters (``otlp://``, ``ops://``) are not built here: naming one is
    an error, as are a second ``prometheus`` URI and a port that is not a number in range
    (AutoMQ falls back to 9090 there)."""
    found: ExporterAddress | None = None
    for part in (piece.strip() for piece in raw.split(",")):
        if not part:
            continue
        split = urlsplit(part)
        if split.scheme != METRICS_EXPORTER_SCHEME:
            raise ValueError(
                f"exporter {part!r}: only prometheus:// is served by this broker "
                "(prometheus://?host=H&port=P)"
            )
        if found is not None:
            raise ValueError(f"exporter {part!r}: a second prometheus:// exporter")
        query = parse_qs(split.query)
        host = (query.get("host") or [split.hostname or ""])[0] or "localhost"
        text = (query.get("port") or [""])[0].strip()
        try:
            port = split.port or (int(text) if text else METRICS_EXPORTER_DEFAULT_PORT)
        except ValueError as error:
            raise ValueError(f"exporter {part!r}: the port must be a number 0-65535") from error
        if not 0 <= port <= 65535:
            raise ValueError(f"exporter {part!r}: the port must be a number 0-65535")
        found = ExporterAddress(host, port)
    return found


def _object_wal_settings(raw: str) -> ObjectWalSettings | None:
    """The object WAL of an ``s3://`` or ``dir://`` path (None for the block WAL's forms);
    raises ValueError naming what is wrong."""
    scheme, location, query = _split_wal_path(raw)
    if scheme in ("", "file", "device"):
        _wal_device_address(raw)
        return None
    if scheme not in ("s3", "dir"):
        raise ValueError(
            f"unknown WAL scheme {scheme!r}: expected a file path, 0@file://PATH (block WAL on "
            "a file or a block device), 0@device://HOST:PORT or 0@device:///SOCKET (block WAL "
            "on a WAL device process), 0@s3://BUCKET?... or 0@dir://PATH (object WAL)"
        )
    parameters = {name: values[-1] for name, values in parse_qs(query).items()}
    known = set(OBJECT_WAL_PARAMETERS) | (_BUCKET_PARAMETERS if scheme == "s3" else set())
    for name in parameters:
        if name not in known:
            raise ValueError(f"unknown WAL parameter {name!r}{did_you_mean(name, known)}")
    numbers: dict[str, int] = {}
    for name, default in OBJECT_WAL_PARAMETERS.items():
        text = parameters.get(name, str(default))
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"the WAL parameter {name}={text!r} must be a positive integer")
        numbers[name] = int(text)
    if scheme == "s3":
        if not location:
            raise ValueError("an s3:// WAL needs a bucket: 0@s3://BUCKET?region=R&endpoint=URL")
        bucket_query = urlencode(
            [(name, parameters[name]) for name in sorted(_BUCKET_PARAMETERS) if name in parameters]
        )
        store_uri = f"s3://{location}" + (f"?{bucket_query}" if bucket_query else "")
    else:
        if not location:
            raise ValueError("a dir:// WAL needs a directory: 0@dir:///PATH")
        store_uri = Path(location).resolve().as_uri()
    return ObjectWalSettings(
        store_uri=store_uri,
        batch_interval_ms=numbers["batchInterval"],
        max_bytes_in_batch=numbers["maxBytesInBatch"],
        max_unflushed_bytes=numbers["maxUnflushedBytes"],
        max_inflight_uploads=numbers["maxInflightUploadCount"],
        readahead_bytes=numbers["readaheadDataSize"],
    )


# The zone router's local write modes (``automq.zonerouter.local.write.mode``, AutoMQ's names):
# records for partitions this broker leads go through its RouterChannel too, or straight to the
# partition. Records for other brokers always go through the channel.
LOCAL_WRITE_MODES = ("router_channel", "direct")
# How the network bandwidth limiter splits its buckets (s3.network.limiter.mode).
NETWORK_LIMITER_MODES = ("separate", "shared")
# Where reads from objects run (cold.read.mode): a child process, a second thread, the loop.
COLD_READ_MODES = ("process", "thread", "loop")


def _one_of(value: str, choices: tuple[str, ...]) -> str:
    """``value`` as one of ``choices`` (case and surrounding spaces aside)."""
    chosen = value.strip().lower()
    if chosen not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}")
    return chosen


@dataclass(frozen=True, slots=True)
class RouterChannelSettings:
    """One channel of ``automq.zonerouter.channels``: its id (the ``<id>@`` before the URI, the
    channel id every channel offset carries, a 16-bit number), the URI as given, and the object
    WAL it names (the channel is an object WAL of its own, on S3 or in a shared directory)."""

    channel_id: int
    uri: str
    wal: ObjectWalSettings


# ``<id>@`` opens each entry of a channel list; a comma before one separates entries (a comma
# elsewhere belongs to the URI).
_CHANNEL_ENTRY_START = re.compile(r",(?=\s*-?\d+@)")
_CHANNEL_ENTRY = re.compile(r"(-?\d+)@(.+)")


@functools.lru_cache(maxsize=16)
def parse_router_channels(raw: str) -> tuple[RouterChannelSettings, ...]:
    """The channels of ``automq.zonerouter.channels``: ``<id>@<object WAL URI>`` entries
    separated by commas (``0@s3://BUCKET?region=R&endpoint=URL&batchInterval=250``); empty or
    blank: none (the router is off). Raises ValueError naming the bad entry."""
    if not raw.strip():
        return ()
    channels: list[RouterChannelSettings] = []
    for number, entry in enumerate(_CHANNEL_ENTRY_START.split(raw.strip()), 1):
        entry = entry.strip()
        where = f"channel {number} ({entry!r})"
        match = _CHANNEL_ENTRY.fullmatch(entry)
        if match is None:
            raise ValueError(
                f"{where}: expected ID@URI, e.g. 0@s3://BUCKET?region=R&endpoint=URL, entries "
                "separated by commas"
            )
        channel_id = int(match.group(1))
        if not 0 <= channel_id < 2**15:
            raise ValueError(f"{where}: the channel id must be in 0..32767, not {channel_id}")
        if any(channel.channel_id == channel_id for channel in channels):
            raise ValueError(f"{where}: channel id {channel_id} is given twice")
        scheme = match.group(2).partition("://")[0]
        if scheme not in ("s3", "dir"):
            raise ValueError(
                f"{where}: a channel is an object WAL: 0@s3://BUCKET?... or 0@dir:///PATH, "
                f"not the scheme {scheme!r}"
            )
        try:
            wal = _object_wal_settings(entry)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        assert wal is not None  # an s3:// or dir:// URI names an object WAL
        channels.append(RouterChannelSettings(channel_id, entry, wal))
    return tuple(channels)


@dataclass(frozen=True, slots=True)
class ZoneCidrBlock:
    """One CIDR block of ``automq.zone.cidr.blocks``: clients connecting from an address in
    ``network`` are in ``zone``. ``text`` is the block as written."""

    zone: str
    network: ipaddress.IPv4Network
    text: str


@functools.lru_cache(maxsize=16)
def parse_zone_cidr_blocks(raw: str) -> tuple[ZoneCidrBlock, ...]:
    """The blocks of ``automq.zone.cidr.blocks``, AutoMQ's grammar ``zone1@cidr1,cidr2<>zone2@
    cidr3``: zones separated by ``<>``, each a zone name, ``@`` and IPv4 CIDR blocks separated
    by commas (host bits are ignored, ``10.0.0.7/8`` is ``10.0.0.0/8``). Blank: none. Raises
    ValueError naming the bad part."""
    blocks: list[ZoneCidrBlock] = []
    if not raw.strip():
        return ()
    for part in raw.split("<>"):
        part = part.strip()
        zone, separator, cidrs = part.partition("@")
        zone = zone.strip()
        if not separator or "@" in cidrs or not zone or not cidrs.strip():
            raise ValueError(
                f"{part!r}: expected ZONE@CIDR[,CIDR...] (zones separated by <>), e.g. "
                "az1@10.0.0.0/16,10.1.0.0/16<>az2@10.2.0.0/16"
            )
        for cidr in cidrs.split(","):
            cidr = cidr.strip()
            address, slash, length = cidr.partition("/")
            if not slash or not length.isdigit() or not 0 <= int(length) <= 32:
                raise ValueError(
                    f"{cidr!r} (zone {zone!r}): expected an IPv4 CIDR block, ADDRESS/LENGTH with "
                    "LENGTH 0..32, e.g. 10.0.0.0/16"
                )
            try:
                network = ipaddress.IPv4Network(f"{address}/{int(length)}", strict=False)
            except ValueError:
                raise ValueError(
                    f"{cidr!r} (zone {zone!r}): {address!r} is not an IPv4 address"
                ) from None
            blocks.append(ZoneCidrBlock(zone, network, cidr))
    return tuple(blocks)


class ConfigError(ValueError):
    """Settings are unknown or have bad values: one line per problem in :attr:`problems`."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@functools.lru_cache(maxsize=64)
def _resolved_listeners(
    listeners: str,
    advertised: str,
    protocol_map: str,
    global_settings: tuple[tuple[str, str], ...],
    own: tuple[tuple[str, tuple[tuple[str, str], ...]], ...],
) -> tuple[Listener, ...]:
    """:func:`resolve_listeners`, once per distinct settings (a config is immutable)."""
    return resolve_listeners(
        listeners, advertised, protocol_map, dict(global_settings), {n: dict(v) for n, v in own}
    )


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``; did you mean 'X'?`` with the known name nearest ``name``, or nothing when none is
    near enough to be a likely typo."""
    nearest = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {nearest[0]!r}?" if nearest else ""


def _problems(error: ValidationError) -> list[str]:
    """Pydantic's errors as one line each: the property, the value given, what is wrong."""
    lines = []
    for detail in error.errors(include_url=False):
        message = detail["msg"].removeprefix("Value error, ")
        location = ".".join(str(part) for part in detail["loc"])
        if location:
            lines.append(f"{location}={detail['input']!r}: {message[0].lower()}{message[1:]}")
        else:  # a check across settings names them in its message
            lines.append(message)
    return lines


class BrokerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    node_id: int = Field(0, alias="node.id", ge=0)
    # The broker's failure domain (an availability zone): placement spreads partitions over
    # racks. Empty: no rack.
    broker_rack: str = Field("", alias="broker.rack")
    cluster_id: str = Field("automq-ref-embedded", alias="cluster.id")
    # The listeners, NAME://host:port comma-separated, each with its security protocol by
    # listener.security.protocol.map (PLAINTEXT, SSL: automq_ref/kafka/tls.py, SASL_PLAINTEXT,
    # SASL_SSL: kafka/sasl.py) and its settings (formats/listeners.py: listener.name.<name>.*).
    listeners: str = Field("PLAINTEXT://127.0.0.1:9092", alias="listeners")
    # What Metadata/FindCoordinator/DescribeCluster hand to the clients of each listener; empty
    # means the bound listeners. Set it when clients reach the broker through a proxy.
    advertised_listeners: str = Field("", alias="advertised.listeners")
    listener_security_protocol_map: str = Field(
        DEFAULT_SECURITY_PROTOCOL_MAP, alias="listener.security.protocol.map"
    )
    # The listener other brokers reach this one on (its links: transaction markers, the zone
    # router). Empty: the listener named PLAINTEXT if there is one, else the first listed.
    inter_broker_listener_name: str = Field("", alias="inter.broker.listener.name")
    # The mechanism of this broker's login on a SASL inter-broker listener (the username and
    # password of that listener's JAAS text for it).
    sasl_mechanism_inter_broker_protocol: str = Field(
        "GSSAPI", alias="sasl.mechanism.inter.broker.protocol"
    )
    # TLS (SSL and SASL_SSL listeners), Kafka's properties; PEM only (Kafka's default type is
    # JKS). A listener's listener.name.<name>.ssl.* override these.
    ssl_keystore_type: str = Field("JKS", alias="ssl.keystore.type")
    ssl_keystore_location: str = Field("", alias="ssl.keystore.location")
    ssl_keystore_certificate_chain: str = Field("", alias="ssl.keystore.certificate.chain")
    ssl_keystore_key: str = Field("", alias="ssl.keystore.key")
    ssl_key_password: str = Field("", alias="ssl.key.password")
    ssl_truststore_type: str = Field("JKS", alias="ssl.truststore.type")
    ssl_truststore_location: str = Field("", alias="ssl.truststore.location")
    ssl_truststore_certificates: str = Field("", alias="ssl.truststore.certificates")
    ssl_client_auth: str = Field("none", alias="ssl.client.auth")
    # SASL (SASL_PLAINTEXT and SASL_SSL listeners): the mechanisms, and each listener's users
    # from listener.name.<name>.plain.sasl.jaas.config.
    sasl_enabled_mechanisms: str = Field("GSSAPI", alias="sasl.enabled.mechanisms")
    # listener.name.<NAME>.<setting> (load_config gathers them): NAME -> setting -> value.
    listener_settings: dict[str, dict[str, str]] = {}
    log_dirs: str = Field("./data", alias="log.dirs")
    # Objects: AutoMQ's bucket URI; empty means a local directory under log.dirs.
    s3_data_buckets: str = Field("", alias="s3.data.buckets")
    # The WAL: the block WAL file (a path, created and preallocated, or AutoMQ's 0@file://PATH
    # form), or the object WAL: 0@s3://BUCKET?region=..&endpoint=..&batchInterval=..&
    # maxBytesInBatch=.. (AutoMQ's form), or 0@dir://PATH for its objects in a directory (of a
    # shared file system: NFS, EFS). A file path naming a raw block device opens it with
    # O_DIRECT; 0@device://HOST:PORT or 0@device:///SOCKET is the block WAL on a WAL device
    # process (reservations, so a survivor can take it over).
    s3_wal_path: str = Field("", alias="s3.wal.path")
    s3_wal_capacity: int = Field(1024 * MIB, alias="s3.wal.capacity", ge=4 * MIB)
    s3_wal_cache_size: int = Field(512 * MIB, alias="s3.wal.cache.size", ge=MIB)
    s3_wal_upload_threshold: int = Field(-1, alias="s3.wal.upload.threshold")
    s3_wal_upload_interval_ms: int = Field(60_000, alias="s3.wal.upload.interval.ms")
    s3_stream_object_split_size: int = Field(8 * MIB, alias="s3.stream.object.split.size")
    s3_block_cache_size: int = Field(128 * MIB, alias="s3.block.cache.size", ge=0)
    # The network bandwidth limiter (AutoMQ's baseline, bytes/s): object GETs in, object PUTs
    # and Fetch responses out, each direction a token bucket (``separate``: in at most one
    # second's worth, out five) or both one (``shared``: two seconds' worth).
    s3_network_baseline_bandwidth: int = Field(
        1024 * MIB, alias="s3.network.baseline.bandwidth", ge=1
    )
    s3_network_limiter_mode: str = Field("separate", alias="s3.network.limiter.mode")
    # The metrics exporters (AutoMQ's): prometheus://?host=H&port=P serves Prometheus' endpoint
    # (automq_ref/io/metrics.py); blank, none.
    s3_telemetry_metrics_exporter_uri: str = Field("", alias="s3.telemetry.metrics.exporter.uri")
    # How long ranged reads of objects wait to be merged with others (shaped_store.py); 0: until
    # the event loop's next turn. AutoMQ waits 5 ms, which a Fetch here pays once per cache miss.
    s3_object_read_merge_window_ms: float = Field(
        0.0, alias="s3.object.read.merge.window.ms", ge=0, le=1000
    )
    # Object compaction (AutoMQ's names and defaults): this node's stream set objects every
    # interval (force split once older than force.split.minutes, the rest merged, at most
    # max.num objects and cache.size bytes a pass, runs above stream.split.size split out), and
    # its open streams' stream objects (a merge up to max.size.bytes every interval.minutes).
    s3_stream_set_object_compaction_interval_minutes: int = Field(
        5, alias="s3.stream.set.object.compaction.interval.minutes", ge=1
    )
    s3_stream_set_object_compaction_cache_size: int = Field(
        200 * MIB, alias="s3.stream.set.object.compaction.cache.size", ge=MIB
    )
    s3_stream_set_object_compaction_stream_split_size: int = Field(
        8 * MIB, alias="s3.stream.set.object.compaction.stream.split.size", ge=0
    )
    s3_stream_set_object_compaction_force_split_minutes: int = Field(
        120, alias="s3.stream.set.object.compaction.force.split.minutes", ge=1
    )
    s3_stream_set_object_compaction_max_num: int = Field(
        500, alias="s3.stream.set.object.compaction.max.num", ge=2
    )
    s3_stream_object_compaction_interval_minutes: int = Field(
        30, alias="s3.stream.object.compaction.interval.minutes", ge=1
    )
    s3_stream_object_compaction_max_size_bytes: int = Field(
        10 * 1024 * MIB, alias="s3.stream.object.compaction.max.size.bytes", ge=MIB
    )
    num_partitions: int = Field(1, alias="num.partitions", ge=1)
    # The replication factor of auto-created topics and of CreateTopics with -1: shared storage
    # keeps one copy, so 1 is the only value (accepted so that Kafka's config files load).
    default_replication_factor: int = Field(1, alias="default.replication.factor")
    auto_create_topics_enable: bool = Field(True, alias="auto.create.topics.enable")
    message_max_bytes: int = Field(1_048_588, alias="message.max.bytes", ge=1)
    socket_request_max_bytes: int = Field(100 * MIB, alias="socket.request.max.bytes", ge=1024)
    group_initial_rebalance_delay_ms: int = Field(
        3000, alias="group.initial.rebalance.delay.ms", ge=0
    )
    # A JoinGroup's session timeout outside these bounds is answered INVALID_SESSION_TIMEOUT.
    group_min_session_timeout_ms: int = Field(6000, alias="group.min.session.timeout.ms", ge=0)
    group_max_session_timeout_ms: int = Field(1_800_000, alias="group.max.session.timeout.ms", ge=0)
    # KIP-848 consumer groups (group.protocol=consumer), Kafka's names and defaults: a member
    # not heard from for the session timeout is fenced; members heartbeat at the interval; no
    # more members than the max size; the server-side assignors (the first is the default).
    group_consumer_session_timeout_ms: int = Field(
        45_000, alias="group.consumer.session.timeout.ms", ge=1
    )
    group_consumer_heartbeat_interval_ms: int = Field(
        5_000, alias="group.consumer.heartbeat.interval.ms", ge=1
    )
    group_consumer_max_size: int = Field(2**31 - 1, alias="group.consumer.max.size", ge=1)
    group_consumer_assignors: str = Field("uniform,range", alias="group.consumer.assignors")
    # The partitions of __consumer_offsets when a broker creates it (Kafka's name and default):
    # groups are spread over them, and each is coordinated by the broker leading its partition.
    offsets_topic_num_partitions: int = Field(50, alias="offsets.topic.num.partitions", ge=1)
    # The transaction coordinator (Kafka's names and defaults): __transaction_state's
    # partitions, the longest transaction timeout a producer may ask for, how long an idle
    # transactional id is kept, and how often timed-out transactions are aborted.
    transaction_state_log_num_partitions: int = Field(
        50, alias="transaction.state.log.num.partitions", ge=1
    )
    transaction_max_timeout_ms: int = Field(900_000, alias="transaction.max.timeout.ms", ge=1)
    transactional_id_expiration_ms: int = Field(
        7 * 24 * 3600 * 1000, alias="transactional.id.expiration.ms", ge=1
    )
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = Field(
        10_000, alias="transaction.abort.timed.out.transaction.cleanup.interval.ms", ge=1
    )
    # Producer state expiry (Kafka's names and defaults): a partition forgets a producer id
    # idle this long (and with no transaction open), checked this often.
    producer_id_expiration_ms: int = Field(86_400_000, alias="producer.id.expiration.ms", ge=1)
    producer_id_expiration_check_interval_ms: int = Field(
        600_000, alias="producer.id.expiration.check.interval.ms", ge=1
    )
    log_retention_ms: int = Field(7 * 24 * 3600 * 1000, alias="log.retention.ms")
    log_retention_bytes: int = Field(-1, alias="log.retention.bytes")
    log_retention_check_interval_ms: int = Field(
        300_000, alias="log.retention.check.interval.ms", ge=100
    )
    # Log compaction of topics with cleanup.policy=compact: whether the cleaner runs, how long
    # it sleeps when nothing was due, and the broker defaults of the topic compaction configs.
    log_cleaner_enable: bool = Field(True, alias="log.cleaner.enable")
    log_cleaner_backoff_ms: int = Field(15_000, alias="log.cleaner.backoff.ms", ge=0)
    log_cleaner_delete_retention_ms: int = Field(
        86_400_000, alias="log.cleaner.delete.retention.ms", ge=0
    )
    log_cleaner_min_compaction_lag_ms: int = Field(
        0, alias="log.cleaner.min.compaction.lag.ms", ge=0
    )
    log_cleaner_max_compaction_lag_ms: int = Field(
        2**63 - 1, alias="log.cleaner.max.compaction.lag.ms", ge=1
    )
    log_cleaner_min_cleanable_ratio: float = Field(
        0.5, alias="log.cleaner.min.cleanable.ratio", ge=0, le=1
    )
    # A cluster: the metadata log on etcd (comma-separated host:port of one etcd cluster).
    # Empty: the embedded file log under log.dirs, one process, no etcd.
    metadata_etcd_endpoints: str = Field("", alias="metadata.etcd.endpoints")
    # etcd's --max-request-bytes: batches and snapshot chunks are sized to fit.
    metadata_etcd_max_request_bytes: int = Field(
        1_572_864, alias="metadata.etcd.max.request.bytes", ge=64 * 1024
    )
    # Kafka's name: the controller writes a snapshot once this many record bytes followed it.
    metadata_log_max_record_bytes_between_snapshots: int = Field(
        20 * MIB, alias="metadata.log.max.record.bytes.between.snapshots", ge=1
    )
    # The active controller's etcd lease (whole seconds, at least 2): a dead controller is
    # replaced within it.
    controller_lease_ttl_ms: int = Field(3000, alias="controller.lease.ttl.ms", ge=2000)
    # Where this broker serves controller requests from the others (host:port); empty: the
    # listener's host and a free port. The address is published in etcd.
    controller_rpc_listener: str = Field("", alias="controller.rpc.listener")
    # How long a request waits for a controller (through a failover) before it fails.
    controller_request_timeout_ms: int = Field(
        30_000, alias="controller.request.timeout.ms", ge=100
    )

    # A cluster's brokers (Kafka's names and defaults): how often a broker heartbeats, and how
    # long the controller waits for a heartbeat before it fences the broker and moves its
    # partitions (where it is, broker.rack, is above).
    broker_heartbeat_interval_ms: int = Field(2000, alias="broker.heartbeat.interval.ms", ge=10)
    broker_session_timeout_ms: int = Field(9000, alias="broker.session.timeout.ms", ge=100)
    # Crash failover (a broker of a cluster whose WAL a survivor can reach: the object WAL or a
    # WAL device): a broker whose session lapsed with streams still open has its WAL taken over
    # by a survivor, unless its node epoch (its start time) is younger than this: a broker that
    # just (re)started is left to recover its WAL itself (AutoMQ's one minute).
    failover_new_epoch_grace_ms: int = Field(60_000, alias="failover.new.epoch.grace.ms", ge=0)
    # A graceful stop (SIGTERM) hands the broker's partitions over first: the controller moves
    # them in batches and each closes here as its move is decided. The broker waits at most
    # this long for them all, then closes what it still holds and exits.
    controlled_shutdown_timeout_ms: int = Field(
        60_000, alias="controlled.shutdown.timeout.ms", ge=0
    )
    # Where this broker records the Failover machine's steps it takes, one file per start, for
    # trace validation against specs/Failover.tla (docs/trace_validation.md); off when unset.
    failover_trace_dir: str | None = Field(None, alias="failover.trace.dir")
    # Record the transaction coordinator's steps of each new transactional id into this
    # directory (<id>.ndjson), for trace validation against specs/Transaction.tla; unset: off.
    transaction_trace_dir: str | None = Field(None, alias="transaction.trace.dir")
    # Route epochs (the zone router's channel lifecycle; on in a cluster whenever
    # automq.zonerouter.channels, below, is set): the active controller bumps the
    # current and fenced route epoch this often (AutoMQ: every 10 s); each broker reports its
    # committed route epoch at most once per commit interval (AutoMQ: 1 s), after committing its
    # LogCache, waiting up to the linger for the uploads that happen anyway (AutoMQ's lazy
    # commit: 10 s) before forcing one.
    automq_zonerouter_route_epoch_bump_interval_ms: int = Field(
        10_000, alias="automq.zonerouter.route.epoch.bump.interval.ms", ge=10
    )
    automq_zonerouter_route_epoch_commit_interval_ms: int = Field(
        1000, alias="automq.zonerouter.route.epoch.commit.interval.ms", ge=10
    )
    automq_zonerouter_route_epoch_commit_linger_ms: int = Field(
        10_000, alias="automq.zonerouter.route.epoch.commit.linger.ms", ge=0
    )
    # Where this broker records the RouteEpoch machine's steps it takes, one file per start, for
    # trace validation against specs/RouteEpoch.tla (docs/trace_validation.md); off when unset.
    automq_zonerouter_route_epoch_trace_dir: str | None = Field(
        None, alias="automq.zonerouter.route.epoch.trace.dir"
    )
    # Where this broker, as a proxy, records the ConfirmWal machine's steps of each of its
    # snapshot-read partitions (one file per partition and main session), for trace validation
    # against specs/ConfirmWal.tla; off when unset.
    automq_zonerouter_snapshot_read_trace_dir: str | None = Field(
        None, alias="automq.zonerouter.snapshot.read.trace.dir"
    )
    # A Produce, Fetch or ListOffsets for a partition placed on this broker that it has not
    # opened yet (it moved here and waits for its old broker's or a failover's close, or is
    # opening) is held at most this long (and never past a Produce's own timeout) for the open,
    # then answered NOT_LEADER_OR_FOLLOWER as before; 0 answers at once. A client's retry
    # backoff after that answer (librdkafka's grows to 1 s) otherwise outlasts the open.
    partition_open_wait_ms: int = Field(1000, alias="partition.open.wait.ms", ge=0)
    # The serving process's heap (automq_ref/io/heap.py): what is alive is frozen out of the
    # cyclic collector's full collections every heap.freeze.interval.ms (0: CPython's default
    # collections), and thawed for one full collection every heap.thaw.interval.ms (0: never).
    heap_freeze_interval_ms: int = Field(5_000, alias="heap.freeze.interval.ms", ge=0)
    heap_thaw_interval_ms: int = Field(600_000, alias="heap.thaw.interval.ms", ge=0)
    # How long a thread of the serving process may hold CPython's interpreter lock while
    # another waits for it (sys.setswitchinterval; CPython's default is 5000). The WAL's I/O
    # thread and the broker's loop give the lock up at each system call and wait that long for
    # it back while the cold-read thread computes: a produce's fsync round trip meets several
    # such waits (docs/broker.md, "The interpreter lock"). 0 leaves CPython's default.
    interpreter_switch_interval_us: int = Field(
        200, alias="interpreter.switch.interval.us", ge=0, le=1_000_000
    )
    # Where reads from objects (the stream readers, block cache and a store of their own) run:
    # "process", a child process started at the first read that misses the LogCache
    # (automq_ref/io/storage/cold_read_process.py), so a catch-up's reading takes no time of the
    # broker's interpreter; "thread", an event loop of their own in a second thread
    # (automq_ref/io/storage/cold_reads.py); "loop", the broker's own event loop.
    cold_read_mode: str = Field("process", alias="cold.read.mode")
    # How much nicer than the broker the cold-read process runs (os.nice): when the machine is
    # short of CPU, the kernel then runs the broker's produce path first.
    cold_read_process_nice: int = Field(10, alias="cold.read.process.nice", ge=0, le=19)
    # The active controller's autobalancer (AutoMQ's names and defaults): a round every
    # anomaly.detect.interval.ms moves partitions off brokers above the mean by more than the
    # deviation, on the loads heartbeats reported within metrics.delay.ms.
    autobalancer_controller_enable: bool = Field(False, alias="autobalancer.controller.enable")
    autobalancer_controller_anomaly_detect_interval_ms: int = Field(
        60_000, alias="autobalancer.controller.anomaly.detect.interval.ms", ge=100
    )
    autobalancer_controller_metrics_delay_ms: int = Field(
        60_000, alias="autobalancer.controller.metrics.delay.ms", ge=0
    )
    autobalancer_controller_network_in_distribution_detect_avg_deviation: float = Field(
        0.2, alias="autobalancer.controller.network.in.distribution.detect.avg.deviation", ge=0
    )
    autobalancer_controller_network_out_distribution_detect_avg_deviation: float = Field(
        0.2, alias="autobalancer.controller.network.out.distribution.detect.avg.deviation", ge=0
    )
    autobalancer_controller_network_in_usage_distribution_detect_threshold: int = Field(
        MIB, alias="autobalancer.controller.network.in.usage.distribution.detect.threshold", ge=0
    )
    autobalancer_controller_network_out_usage_distribution_detect_threshold: int = Field(
        MIB, alias="autobalancer.controller.network.out.usage.distribution.detect.threshold", ge=0
    )
    autobalancer_controller_execution_steps: int = Field(
        60, alias="autobalancer.controller.execution.steps", ge=1
    )

    # The authorizer (Kafka's StandardAuthorizer, or "": none, all allowed), its super users
    # (;-separated: User:alice) and the no-ACL default (state_machines/acl.py).
    authorizer_class_name: str = Field("", alias="authorizer.class.name")
    super_users: str = Field("", alias="super.users")
    allow_everyone_if_no_acl_found: bool = Field(False, alias="allow.everyone.if.no.acl.found")

    # Zones (AutoMQ's zone router). The channels clients' produce data crosses zones through:
    # each broker's own object WAL instance per channel (0@s3://BUCKET?region=R&endpoint=URL&
    # batchInterval=250&maxBytesInBatch=8388608, entries separated by commas). Set: the router
    # is on, broker.rack is required, and Metadata names clients in a zone brokers of that zone.
    # Empty: off.
    automq_zonerouter_channels: str = Field("", alias="automq.zonerouter.channels")
    # router_channel: records for partitions led here go through the channel too; direct: they
    # are appended to the partition at once.
    automq_zonerouter_local_write_mode: str = Field(
        "router_channel", alias="automq.zonerouter.local.write.mode"
    )
    # A client's zone when its client.id does not name one (automq_az=ZONE): by the address it
    # connects from, zone1@cidr1,cidr2<>zone2@cidr3. Empty: no zone.
    automq_zone_cidr_blocks: str = Field("", alias="automq.zone.cidr.blocks")

    @field_validator("authorizer_class_name", "super_users")
    @classmethod
    def _authorizer(cls, value: str, info: ValidationInfo) -> str:
        try:  # the property is named by _problems
            AuthorizerSettings.of_properties(
                *(("", value) if info.field_name == "super_users" else (value,))
            )
        except ValueError as error:
            raise ValueError(str(error).partition(f"{value.strip()}: ")[2] or str(error)) from error
        return value

    @field_validator("listeners", "advertised_listeners")
    @classmethod
    def _listener_list(cls, value: str, info: ValidationInfo) -> str:
        if value.strip() or info.field_name == "listeners":
            parse_listeners(value, distinct_ports=info.field_name == "listeners")
        return value

    @field_validator("listener_security_protocol_map")
    @classmethod
    def _protocol_map(cls, value: str) -> str:
        parse_protocol_map(value)
        return value

    @field_validator("ssl_client_auth")
    @classmethod
    def _client_auth(cls, value: str) -> str:
        return _one_of(value, SSL_CLIENT_AUTH)

    @model_validator(mode="after")
    def _listener_protocol(self) -> BrokerConfig:
        self.listener_specs  # noqa: B018 (raises naming the property)
        inter = self.inter_broker_listener
        if inter.sasl is not None and self.etcd_endpoints:
            mechanism = self.sasl_mechanism_inter_broker_protocol.upper()
            name = "sasl.mechanism.inter.broker.protocol"
            if mechanism not in inter.sasl.mechanisms:
                raise ValueError(
                    f"{name}={mechanism}: the inter-broker listener {inter.name} enables "
                    f"{', '.join(inter.sasl.mechanisms)} (set {name} to one of them)"
                )
            if inter.sasl.login(mechanism) is None:
                raise ValueError(
                    f"the inter-broker listener {inter.name} is SASL: this broker logs in to "
                    f"the others with the username and password of "
                    f'{inter.sasl.jaas_property(mechanism)} (username="..." '
                    'password="...")'
                )
        return self

    @field_validator("s3_wal_path")
    @classmethod
    def _wal_path(cls, value: str) -> str:
        _object_wal_settings(value)
        return value

    @field_validator("automq_zonerouter_channels")
    @classmethod
    def _router_channels(cls, value: str) -> str:
        parse_router_channels(value)
        return value

    @field_validator("automq_zonerouter_local_write_mode")
    @classmethod
    def _local_write_mode(cls, value: str) -> str:
        return _one_of(value, LOCAL_WRITE_MODES)

    @field_validator("s3_telemetry_metrics_exporter_uri")
    @classmethod
    def _metrics_exporter_uri(cls, value: str) -> str:
        parse_exporter_uri(value)
        return value

    @field_validator("s3_network_limiter_mode")
    @classmethod
    def _network_limiter_mode(cls, value: str) -> str:
        return _one_of(value, NETWORK_LIMITER_MODES)

    @field_validator("cold_read_mode")
    @classmethod
    def _cold_read_mode(cls, value: str) -> str:
        return _one_of(value, COLD_READ_MODES)

    @field_validator("automq_zone_cidr_blocks")
    @classmethod
    def _zone_cidr_blocks(cls, value: str) -> str:
        parse_zone_cidr_blocks(value)
        return value

    @field_validator("metadata_etcd_endpoints")
    @classmethod
    def _etcd_endpoints(cls, value: str) -> str:
        for endpoint in filter(None, (part.strip() for part in value.split(","))):
            address = endpoint.removeprefix("http://")
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"{endpoint!r}: expected host:port (or http://host:port)")
        return value

    @field_validator("controller_rpc_listener")
    @classmethod
    def _rpc_listener(cls, value: str) -> str:
        if value:
            host, _, port = value.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError("expected host:port")
        return value

    @field_validator("default_replication_factor")
    @classmethod
    def _one_copy(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"{value}: shared storage keeps one copy of a partition (use 1)")
        return value

    @field_validator("group_consumer_assignors")
    @classmethod
    def _known_assignors(cls, value: str) -> str:
        """Kafka's names (uniform, range) or its assignor classes, kept as names."""
        names = [n.strip().rsplit(".", 1)[-1] for n in value.split(",") if n.strip()]
        names = [{"UniformAssignor": "uniform", "RangeAssignor": "range"}.get(n, n) for n in names]
        unknown = [n for n in names if n not in ("uniform", "range")]
        if not names or unknown:
            raise ValueError(f"{value}: the assignors are uniform and range")
        return ",".join(dict.fromkeys(names))

    @model_validator(mode="after")
    def _consumer_heartbeat_within_session(self) -> BrokerConfig:
        if self.group_consumer_heartbeat_interval_ms >= self.group_consumer_session_timeout_ms:
            raise ValueError(
                "group.consumer.heartbeat.interval.ms must be lower than "
                "group.consumer.session.timeout.ms"
            )
        return self

    @model_validator(mode="after")
    def _session_bounds_ordered(self) -> BrokerConfig:
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError(
                "group.min.session.timeout.ms must not exceed group.max.session.timeout.ms"
            )
        return self

    @model_validator(mode="after")
    def _router_needs_a_rack(self) -> BrokerConfig:
        if self.automq_zonerouter_channels.strip() and not self.broker_rack.strip():
            raise ValueError(
                "automq.zonerouter.channels is set (the zone router is on) but broker.rack is "
                "empty: the router needs each broker's zone (broker.rack=ZONE)"
            )
        return self

    @property
    def listener_specs(self) -> tuple[Listener, ...]:
        """The listeners, in ``listeners``' order, with their protocols and settings."""
        return _resolved_listeners(
            self.listeners,
            self.advertised_listeners,
            self.listener_security_protocol_map,
            tuple(
                (name, str(value))
                for name, value in self.model_dump(by_alias=True).items()
                if name.startswith("ssl.") or name == "sasl.enabled.mechanisms"
            ),
            tuple((n, tuple(sorted(v.items()))) for n, v in sorted(self.listener_settings.items())),
        )

    @property
    def authorizer(self) -> AuthorizerSettings:
        """The authorizer's settings (``enabled`` False: no authorizer)."""
        return AuthorizerSettings.of_properties(
            self.authorizer_class_name, self.super_users, self.allow_everyone_if_no_acl_found
        )

    @property
    def inter_broker_listener(self) -> Listener:
        """The listener other brokers reach this one on (``inter.broker.listener.name``)."""
        specs = self.listener_specs
        name = self.inter_broker_listener_name.upper()
        if not name:
            return next((s for s in specs if s.name == "PLAINTEXT"), specs[0])
        for spec in specs:
            if spec.name == name:
                if spec.advertised is None:
                    raise ValueError(
                        f"inter.broker.listener.name={name}: the listener is not in "
                        f"advertised.listeners ({self.advertised_listeners})"
                    )
                return spec
        raise ValueError(
            f"inter.broker.listener.name={name}: not a listener of listeners ({self.listeners})"
        )

    @property
    def data_dir(self) -> Path:
        return Path(self.log_dirs)

    @property
    def object_store_uri(self) -> str:
        if self.s3_data_buckets:
            return self.s3_data_buckets
        return (self.data_dir / "objects").resolve().as_uri()

    @property
    def wal_file(self) -> Path:
        """The block WAL's file (where it would be, when ``object_wal`` is set instead)."""
        raw = self.s3_wal_path
        if not raw or self.object_wal is not None or self.wal_device is not None:
            return self.data_dir / "wal"
        raw = raw.split("@", 1)[1] if "@" in raw.split("/", 1)[0] else raw
        raw = raw.removeprefix("file://").split("?", 1)[0]
        return Path(raw)

    @property
    def wal_location(self) -> str:
        """Where this broker's WAL lives, as it publishes it at registration: ``s3.wal.path``,
        or the block WAL's default file as ``0@file://PATH`` (a crash failover takes over only
        an object WAL or a WAL device process)."""
        return self.s3_wal_path.strip() or f"0@file://{self.wal_file.resolve()}"

    @property
    def wal_device(self) -> str | None:
        """The WAL device process ``s3.wal.path`` names (``0@device://``), or None."""
        return _wal_device_address(self.s3_wal_path)

    @property
    def metrics_exporter(self) -> ExporterAddress | None:
        """Where the Prometheus endpoint listens (``s3.telemetry.metrics.exporter.uri``)."""
        return parse_exporter_uri(self.s3_telemetry_metrics_exporter_uri)

    @property
    def object_wal(self) -> ObjectWalSettings | None:
        """The object WAL ``s3.wal.path`` names, or None for the block WAL."""
        return _object_wal_settings(self.s3_wal_path)

    @property
    def zone_router_channels(self) -> tuple[RouterChannelSettings, ...]:
        """The zone router's channels (empty: the router is off)."""
        return parse_router_channels(self.automq_zonerouter_channels)

    @property
    def zone_router_enabled(self) -> bool:
        return bool(self.zone_router_channels)

    @property
    def zone_cidr_blocks(self) -> tuple[ZoneCidrBlock, ...]:
        """Clients' zones by address (``automq.zone.cidr.blocks``), in the order written."""
        return parse_zone_cidr_blocks(self.automq_zone_cidr_blocks)

    @property
    def etcd_endpoints(self) -> tuple[str, ...]:
        """``metadata.etcd.endpoints`` as host:port entries; empty without a cluster."""
        parts = (part.strip() for part in self.metadata_etcd_endpoints.split(","))
        return tuple(part.removeprefix("http://") for part in parts if part)

    @property
    def controller_rpc_address(self) -> tuple[str, int]:
        if not self.controller_rpc_listener:
            return self.inter_broker_listener.host, 0
        host, port = self.controller_rpc_listener.rsplit(":", 1)
        return host, int(port)

    @property
    def upload_threshold_bytes(self) -> int:
        if self.s3_wal_upload_threshold > 0:
            return self.s3_wal_upload_threshold
        return min(self.s3_wal_cache_size // 3, 500 * MIB)


def parse_properties(text: str) -> dict[str, str]:
    """Java-style ``name=value`` lines; ``#``/``!`` comments; ``:`` also separates."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        separator = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if separator < 0:
            raise ConfigError(f"line {number}: expected name=value, got {line!r}")
        values[line[:separator].strip()] = line[separator + 1 :].strip()
    return values


def load_config(
    properties_file: Path | None = None,
    overrides: Iterable[str] = (),
    environment: Mapping[str, str] | None = None,
) -> BrokerConfig:
    values: dict[str, Any] = {}
    if properties_file is not None:
        values.update(parse_properties(properties_file.read_text()))
    names = {field.alias for field in BrokerConfig.model_fields.values() if field.alias}
    env = os.environ if environment is None else environment
    for name in names:
        variable = "AUTOMQ_" + name.upper().replace(".", "_")
        if variable in env:
            values[name] = env[variable]
    for override in overrides:
        name, separator, value = override.partition("=")
        if not separator:
            raise ConfigError(f"--override {override!r}: expected name=value")
        values[name.strip()] = value.strip()
    own: dict[str, dict[str, str]] = {}
    for name in [name for name in values if listener_setting(name) is not None]:
        listener, setting = listener_setting(name)  # type: ignore[misc]
        if is_listener_setting(setting):
            own.setdefault(listener, {})[setting] = values.pop(name)
    problems = [
        f"unknown setting {name!r}"
        + (did_you_mean(name, names) or "; docs/broker.md lists the settings")
        for name in sorted(set(values) - names)
    ]
    try:
        config = BrokerConfig.model_validate(
            {**{k: v for k, v in values.items() if k in names}, "listener_settings": own}
        )
    except ValidationError as error:
        raise ConfigError(*problems, *_problems(error)) from error
    if problems:
        raise ConfigError(*problems)
    return config
