"""What a broker counts for Prometheus, and the HTTP endpoint a Prometheus server scrapes.

Each node has one :class:`BrokerMetrics`, on a ``prometheus_client`` registry of its own (tests
run several nodes in one process), which the shell's parts count into as things happen:

- the listener (:mod:`automq_ref.kafka.server`): the requests answered and their time, per API
  (``kafka_request_count_total``, ``kafka_request_time_milliseconds``, from the frame's arrival
  to its answer being written), the error codes the answers carry, per API and error name, NONE
  left out (``kafka_request_error_count_total``), the bytes read and written
  (``kafka_broker_network_io_bytes_total`` by ``direction``) and the open connections
  (``kafka_server_connection_count``);
- the object store (:class:`automq_ref.io.storage.object_store.MeasuredStore` around the node's
  store): every request by operation
  with its time and outcome (``kafka_stream_operation_latency`` with ``operation_type="S3Request"``,
  in seconds) and the bytes uploaded and downloaded (``kafka_stream_upload_size_total``,
  ``kafka_stream_download_size_total``);
- the storage (:mod:`automq_ref.io.storage.s3stream`): each append until it is durable in the WAL
  (``kafka_stream_operation_latency`` with ``operation_type="S3Storage"``,
  ``operation_name="append"``) and the WAL's bytes (``kafka_stream_wal_append_size_total``);
  each stage of an upload of the WAL's data as it ends (``kafka_stream_upload_stage_latency``
  by ``stage``, seconds) and the objects the uploads put, with their bytes
  (``kafka_stream_upload_object_count_total``, ``kafka_stream_upload_object_size_total``),
  told by :mod:`automq_ref.io.storage.storage_metrics`, whose collector reads the block cache's
  and the LogCache's hits and misses at each scrape.

What is a state rather than an event (partitions led, log offsets, groups, traffic per topic) is
read when Prometheus scrapes, by collectors the node registers (:meth:`BrokerMetrics.register`;
the Kafka side's is :mod:`automq_ref.kafka.broker_metrics`).

The names and labels are those AutoMQ's Prometheus exporter gives the same series (its
OpenTelemetry metrics, ``kafka_`` and ``kafka_stream_`` prefixed), so its alert rules and
dashboards find them; latencies here are Prometheus histograms (AutoMQ's also export
``_50p``/``_99p`` gauges; ``histogram_quantile`` gives those here).

The endpoint (:class:`MetricsEndpoint`) serves ``GET /metrics`` (any path does, as
``prometheus_client``'s own server) on the node's event loop, from aiohttp, so collectors read
the broker's state on the loop that changes it. The exposition text is ``prometheus_client``'s
(:func:`prometheus_client.generate_latest`). It is configured as AutoMQ configures its exporter,
``s3.telemetry.metrics.exporter.uri=prometheus://?host=H&port=P``
(:func:`automq_ref.config.parse_exporter_uri`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# Request time buckets, milliseconds: AutoMQ's latency boundaries from 1 ms up.
REQUEST_BUCKETS_MS: Final = (
    0.5, 1, 3, 5, 7, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 500,
    1000, 3000, 5000, 10000, 30000, 60000,
)  # fmt: skip
# Storage operation buckets, seconds: the same boundaries, from 100 us.
OPERATION_BUCKETS_S: Final = tuple(
    ms / 1000 for ms in (0.1, 0.5, 1, 3, 5, 7, 10, 20, 30, 50, 100, 200, 500, 1000, 3000, 10000)
)
S3_REQUEST: Final = "S3Request"
S3_STORAGE: Final = "S3Storage"
SUCCESS: Final = "success"
# The stages of an upload of the WAL's data to objects, as the storage names them.
UPLOAD_STAGES: Final = ("prepare", "put", "commit")
FAILED: Final = "failed"


class BrokerMetrics:
    """One node's instruments, on its own registry (see the module docstring)."""

    def __init__(self) -> None:
        # No ``_created`` series (a counter's creation time), as AutoMQ's exporter has none:
        # a setting of prometheus_client's for the whole process, which the broker is.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        registry = CollectorRegistry()
        self.registry = registry
        self._requests = Counter(
            "kafka_request_count", "Requests answered, by API.", ["type"], registry=registry
        )
        self._request_errors = Counter(
            "kafka_request_error_count",
            "Error codes answered (top level and per entry, NONE not counted), by API and error.",
            ["type", "error"],
            registry=registry,
        )
        self._request_time = Histogram(
            "kafka_request_time_milliseconds",
            "Time from a request's arrival to its answer written, by API.",
            ["type"],
            buckets=REQUEST_BUCKETS_MS,
            registry=registry,
        )
        self._network_io = Counter(
            "kafka_broker_network_io_bytes",
            "Bytes read from (in) and written to (out) Kafka connections.",
            ["direction"],
            registry=registry,
        )
        self.network_in = self._network_io.labels("in")
        self.network_out = self._network_io.labels("out")
        self.connections = Gauge(
            "kafka_server_connection_count", "Open Kafka connections.", registry=registry
        )
        self._operations = Histogram(
            "kafka_stream_operation_latency",
            "Storage operations (S3 requests, WAL appends) until done, seconds.",
            ["operation_type", "operation_name", "status"],
            buckets=OPERATION_BUCKETS_S,
            registry=registry,
        )
        self.uploaded = Counter(
            "kafka_stream_upload_size", "Bytes put to object storage.", registry=registry
        )
        self.downloaded = Counter(
            "kafka_stream_download_size", "Bytes got from object storage.", registry=registry
        )
        self.wal_appended = Counter(
            "kafka_stream_wal_append_size", "Bytes appended to the WAL.", registry=registry
        )
        upload_stages = Histogram(
            "kafka_stream_upload_stage_latency",
            "Stages of the WAL's uploads to objects (prepare, put, commit) until done, seconds.",
            ["stage"],
            buckets=OPERATION_BUCKETS_S,
            registry=registry,
        )
        self._by_stage = {stage: upload_stages.labels(stage) for stage in UPLOAD_STAGES}
        self.uploaded_objects = Counter(
            "kafka_stream_upload_object_count",
            "Objects the WAL's uploads put (stream set and stream objects).",
            registry=registry,
        )
        self.uploaded_object_bytes = Counter(
            "kafka_stream_upload_object_size",
            "Bytes of the objects the WAL's uploads put.",
            registry=registry,
        )
        # Children by label, looked up once (labels() takes a lock and builds a tuple).
        self._by_api: dict[str, tuple[Counter, Histogram]] = {}
        self._by_operation: dict[tuple[str, str, str], Histogram] = {}
        self._by_error: dict[tuple[str, str], Counter] = {}

    def register(self, collector: Collector) -> None:
        """Add a collector read at each scrape."""
        self.registry.register(collector)

    def request_answered(self, api: str, milliseconds: float) -> None:
        children = self._by_api.get(api)
        if children is None:
            children = (self._requests.labels(api), self._request_time.labels(api))
            self._by_api[api] = children
        children[0].inc()
        children[1].observe(milliseconds)

    def request_error(self, api: str, error: str) -> None:
        """One error code (by its Kafka name) in an answer to ``api``."""
        key = (api, error)
        child = self._by_error.get(key)
        if child is None:
            child = self._by_error[key] = self._request_errors.labels(*key)
        child.inc()

    def upload_stage(self, stage: str, seconds: float, sizes: Mapping[int, int]) -> None:
        """An upload stage ended (:data:`UPLOAD_STAGES`); ``sizes``: the put's objects."""
        self._by_stage[stage].observe(seconds)
        if sizes:
            self.uploaded_objects.inc(len(sizes))
            self.uploaded_object_bytes.inc(sum(sizes.values()))

    def operation(self, operation_type: str, name: str, ok: bool, seconds: float) -> None:
        key = (operation_type, name, SUCCESS if ok else FAILED)
        child = self._by_operation.get(key)
        if child is None:
            child = self._by_operation[key] = self._operations.labels(*key)
        child.observe(seconds)

    def exposition(self) -> bytes:
        """The registry's series in Prometheus' text format."""
        return generate_latest(self.registry)


# ---------------------------------------------------------------------------- the endpoint


class MetricsEndpoint:
    """``metrics``' exposition over HTTP on the running event loop, until :meth:`close`."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on ``host:port`` (port 0: a free one); the address bound."""
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._scrape)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, reuse_address=True)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server  # aiohttp keeps the bound sockets there
        assert server is not None
        sockets = getattr(server, "sockets", None) or ()
        bound = sockets[0].getsockname()[1] if sockets else port
        self.address = (host, bound)
        return self.address

    @property
    def url(self) -> str:
        """Where Prometheus scrapes (once started)."""
        assert self.address is not None, "not started"
        host, port = self.address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/metrics"

    async def _scrape(self, request: web.Request) -> web.Response:
        body = self._metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
