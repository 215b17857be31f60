"""Cross-zone bytes per produced byte, measured by the kernel, with the zone router off and on.

    python -m bench.cross_zone_bench [--router off|on|both] [--seconds 60] [--rate 200]
                                     [--record-bytes 1024] [--partitions 6]
                                     [--throughput-mib 30] [--quick] [--keep] [--out FILE]
                                     [--plot FILE]

Each mode runs on a fresh three-zone network (``automq_ref/netzones.py``) and a fresh cluster
in it, as ``automq-ref cluster --zones`` starts it: etcd and moto in the region, broker N in zone
azN (``broker.rack=azN``), the object WAL in the bucket. One client process per zone (this
module's ``worker`` mode, under ``ip netns exec``, bootstrapping from its own zone's broker)
runs a producer and a consumer (confluent-kafka):

- the producer sends ``--rate`` records a second of ``--record-bytes`` bytes (acks=all,
  idempotent, linger.ms=5, no compression) round-robin over the ``--partitions`` partitions of
  one topic (placed evenly: two per broker with 6), for ``--seconds``;
- the consumer reads every partition (assigned, from the end as it starts, before the producers
  begin) until ``GRACE_S`` after the producers stop.

Reported, per mode:

- **cross-zone bytes per produced byte**: the kernel's byte counters on the zones' inter-zone
  links (whole frames, headers included) read just before the producers start and after every
  client stopped, over the payload acknowledged (records x record bytes); per zone both
  directions (out to the other zones, in from them) and the sum of the outs. The window holds
  the consumers' reads too: with the router off, a producer sends 2/3 of its records to leaders
  in other zones and each of the three consumers reads 2/3 of all records from other zones, so
  the expected figure is 2/3 + 3 x 2/3 = 2.67, plus headers and the cluster's own background;
- produce latency p50 / p99 (send to acknowledgement) over every producer, and the end-to-end
  latency (send to a consumer's poll, one machine clock) of records read in another zone;
- the cluster's idle crossing (bytes a second over ``IDLE_S`` with the topic made and no
  client yet) beside the window's;
- what crossed, by connection: the TCP payload (from ``ss`` in each zone) of the connections
  between zones still open at the window's end (the brokers' own: snapshot-read polls and
  zone-router requests on the Kafka listeners, the controller's RPC), per direction;
- **S3 requests per GB produced**: the S3 server's (moto's) own request log, one line per
  request with its client's address, counted over the same window, by method;
- the **monthly cross-zone cost** at ``--throughput-mib`` MiB/s of produce (default 30, seed
  002's example): GB a month x factor x $0.02 (cross-zone traffic is billed $0.01/GB on each
  side), beside the seed's worked example, Kafka with three replicas and clients spread over
  three zones: 30 x 3600 x 24 x 30 / 1024 x (2/3 + 2) x 0.02 = $4050 a month (VMs: $272).

``--router on`` runs the same workload with the zone router's configuration: every broker gets
``automq.zonerouter.channels=0@s3://<bucket>?...&endpoint=<the region's S3>`` and every client
``client.id=automq_az=<zone>``. Where the brokers refuse the setting or the run fails, the mode's
figure is ``null`` and the reason goes to stderr; no figure is ever made up.

The last line on stdout is a JSON object with ``router_off_cross_zone_per_produced_byte`` and
``router_on_cross_zone_per_produced_byte``. ``--quick`` (20 s at 100 records a second per zone,
both modes) finishes within five minutes. Needs root and iproute2 (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from automq_ref.launch import BUCKET, REGION, ClusterSettings, LaunchError, LocalCluster
from automq_ref.netzones import Counters, ZoneNetwork, ZoneNetworkError, unavailable_reason
from bench.broker_bench import GIGABYTE, percentile

ROOT = Path(__file__).resolve().parents[1]
ZONES = ("az1", "az2", "az3")
MODES = ("off", "on")
# What the producers stop before the consumers do: the tail they still read.
GRACE_S = 5.0
# Before the clients start: the cluster's idle crossing (the topic exists, nobody produces).
IDLE_S = 5.0
# From the workers' start to the producers' first record: clients connect and the consumers
# take their positions at the end of every partition.
WARMUP_S = 8.0
SEED_THROUGHPUT_MIB_S = 30
SEED_KAFKA_FACTOR = 2 / 3 + 2
PRICE_PER_GB_EACH_WAY = 0.01
SEED_VM_MONTHLY = 272
SAMPLE_S = 1.0
HEADER = 17  # sequence (8), send time in ns (8), zone index (1)
REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)?(GET|PUT|POST|DELETE|HEAD) ')
WORKER_TIMEOUT_S = 240.0


def log(message: str) -> None:
    print(f"[cross_zone_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def monthly_cost(throughput_mib_s: float, factor: float) -> float:
    """Seed 002's formula: GB a month (30 days, MiB/1024) x factor x $0.01 on each side."""
    gb_month = throughput_mib_s * 60 * 60 * 24 * 30 / 1024
    return gb_month * factor * PRICE_PER_GB_EACH_WAY * 2


# ---------------------------------------------------------------------- the client in a zone


def worker(arguments: argparse.Namespace) -> None:
    """One zone's producer and consumer; prints one JSON line of what they saw."""
    from confluent_kafka import OFFSET_END, Consumer, KafkaError, Message, Producer, TopicPartition

    zone_index = ZONES.index(arguments.zone)
    common: dict[str, Any] = {"bootstrap.servers": arguments.bootstrap}
    if arguments.client_id:
        common["client.id"] = arguments.client_id
    consumer = Consumer(
        {
            **common,
            "group.id": f"bench-{arguments.zone}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign(
        [TopicPartition(arguments.topic, p, OFFSET_END) for p in range(arguments.partitions)]
    )
    consumed = [0, 0, 0]
    consumed_by_partition = [0] * arguments.partitions
    e2e_ms: list[float] = []
    stop_consuming = threading.Event()

    def consume() -> None:
        while not stop_consuming.is_set():
            message = consumer.poll(0.1)
            if message is None or message.error() is not None:
                continue
            value = message.value() or b""
            if len(value) < HEADER:
                continue
            source = value[16]
            consumed[source] += 1
            consumed_by_partition[message.partition() or 0] += 1
            if source != zone_index:
                sent_ns = int.from_bytes(value[8:16], "big")
                e2e_ms.append((time.time_ns() - sent_ns) / 1e6)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    producer = Producer(
        {
            **common,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "none",
        }
    )
    # Connect before the window: a metadata request.
    producer.list_topics(arguments.topic, timeout=30)
    produce_ms: list[float] = []
    acked_by_partition = [0] * arguments.partitions
    failures: list[str] = []

    def delivered_for(sent: float) -> Callable[[KafkaError | None, Message], None]:
        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is None:
                produce_ms.append((time.monotonic() - sent) * 1000)
                acked_by_partition[message.partition() or 0] += 1
            else:
                failures.append(str(error))

        return delivered

    time.sleep(max(0.0, arguments.start_at - time.time()))
    padding = bytes(max(0, arguments.record_bytes - HEADER))
    started = time.monotonic()
    sequence = 0
    while time.monotonic() - started < arguments.seconds:
        due = int((time.monotonic() - started) * arguments.rate)
        while sequence < due:
            value = (
                sequence.to_bytes(8, "big")
                + time.time_ns().to_bytes(8, "big")
                + bytes([zone_index])
                + padding
            )
            sent = time.monotonic()
            try:
                producer.produce(
                    arguments.topic,
                    value=value,
                    partition=sequence % arguments.partitions,
                    on_delivery=delivered_for(sent),
                )
            except BufferError:
                producer.poll(0.05)
                continue
            sequence += 1
        producer.poll(0.005)
    unacknowledged = producer.flush(60)
    time.sleep(GRACE_S)
    stop_consuming.set()
    reader.join(10)
    consumer.close()
    print(
        json.dumps(
            {
                "zone": arguments.zone,
                "sent": sequence,
                "acknowledged": len(produce_ms),
                "unacknowledged": unacknowledged,
                "failures": failures[:5],
                "failed": len(failures),
                "produce_ms": [round(value, 2) for value in produce_ms],
                "consumed": dict(zip(ZONES, consumed, strict=True)),
                "acked_by_partition": acked_by_partition,
                "consumed_by_partition": consumed_by_partition,
                "e2e_other_zones_ms": [round(value, 2) for value in e2e_ms],
            }
        ),
        flush=True,
    )


def create_topic(arguments: argparse.Namespace) -> None:
    """Create the topic and wait until the bootstrap broker names a leader for every
    partition; prints the leaders."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": arguments.bootstrap})
    for future in admin.create_topics(
        [NewTopic(arguments.topic, arguments.partitions)], request_timeout=30
    ).values():
        future.result(60)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        leaders = {}
        for address in arguments.bootstrap.split(","):
            found = (
                AdminClient({"bootstrap.servers": address})
                .list_topics(arguments.topic, timeout=10)
                .topics.get(arguments.topic)
            )
            if found is None or found.error is not None:
                break
            leaders[address] = {p: meta.leader for p, meta in found.partitions.items()}
        else:
            views = list(leaders.values())
            if (
                len(views[0]) == arguments.partitions
                and all(leader >= 0 for leader in views[0].values())
                and all(view == views[0] for view in views)
            ):
                print(json.dumps({"leaders": views[0]}), flush=True)
                return
        time.sleep(0.2)
    raise SystemExit(f"the brokers did not agree on {arguments.topic}'s leaders")


# ------------------------------------------------------------------------------ one mode


@dataclass
class ModeResult:
    mode: str
    factor: float | None = None
    reason: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    samples: list[tuple[float, int]] = field(default_factory=list)


class RoutedCluster(LocalCluster):
    """The cluster with the zone router on: its channel in the cluster's bucket on the region's
    S3 server (known once moto runs, before the brokers start)."""

    def broker_overrides(self, node_id: int) -> list[str]:
        channel = f"0@s3://{BUCKET}?region={REGION}&endpoint={self.s3_endpoint}&pathStyle=true"
        return [*super().broker_overrides(node_id), f"automq.zonerouter.channels={channel}"]


def python_in(network: ZoneNetwork, zone: str, *arguments: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        network.command(zone, [sys.executable, "-m", "bench.cross_zone_bench", *arguments]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def finished(process: subprocess.Popen[str], what: str) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    if process.returncode != 0 or not out.strip():
        raise RuntimeError(f"{what} failed (exit {process.returncode}): {err.strip()[-1500:]}")
    answer: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return answer


def connection_bytes(network: ZoneNetwork) -> dict[tuple[str, str, str], tuple[int, int]]:
    """Every TCP connection between two zones, from the side that opened it (``ss -tin`` in
    its zone's namespace; a connection from a port the zone listens on is the other side's):
    (zone, local address, peer address) -> (payload bytes sent, received)."""
    found: dict[tuple[str, str, str], tuple[int, int]] = {}
    zone_prefixes = {network.zone_address(zone).rsplit(".", 1)[0] for zone in ZONES}
    for zone in ZONES:
        listening = subprocess.run(
            network.command(zone, ["ss", "-tlnH"]), capture_output=True, text=True, check=False
        ).stdout
        ports = {line.split()[3].rsplit(":", 1)[1] for line in listening.splitlines() if line}
        out = subprocess.run(
            network.command(zone, ["ss", "-tinH"]), capture_output=True, text=True, check=False
        ).stdout
        key: tuple[str, str, str] | None = None
        for line in out.splitlines():
            if not line[:1].isspace():
                parts = line.split()
                key = None
                if len(parts) >= 5:
                    local, peer = parts[3], parts[4]
                    peer_prefix = peer.rsplit(":", 1)[0].rsplit(".", 1)[0]
                    local_host, local_port = local.rsplit(":", 1)
                    if (
                        peer_prefix in zone_prefixes
                        and peer_prefix != local_host.rsplit(".", 1)[0]
                        and local_port not in ports
                    ):
                        key = (zone, local, peer)
                continue
            if key is not None:
                sent = re.search(r"bytes_sent:(\d+)", line)
                received = re.search(r"bytes_received:(\d+)", line)
                found[key] = (
                    int(sent.group(1)) if sent else 0,
                    int(received.group(1)) if received else 0,
                )
                key = None
    return found


def crossing_by_kind(
    before: dict[tuple[str, str, str], tuple[int, int]],
    after: dict[tuple[str, str, str], tuple[int, int]],
    kafka_ports: set[int],
) -> dict[str, dict[str, int]]:
    """The TCP payload (no headers) that crossed zones over the window on the connections
    still open at its end, by what the connection is: to a broker's Kafka listener (the
    brokers' zone-router requests and snapshot-read polls; the clients' connections have
    closed by then, so their bytes are not here) or to another port (the active controller's
    RPC), each as sent by the side that opened it (``request``) and by the side that accepted
    it (``answer``)."""
    kinds: dict[str, dict[str, int]] = {}
    for (_zone, local, peer), (sent, received) in after.items():
        old_sent, old_received = before.get((_zone, local, peer), (0, 0))
        peer_port = int(peer.rsplit(":", 1)[1])
        kind = "kafka_listener" if peer_port in kafka_ports else "other_port_controller_rpc"
        row = kinds.setdefault(kind, {"connections": 0, "request": 0, "answer": 0})
        row["connections"] += 1
        row["request"] += sent - old_sent
        row["answer"] += received - old_received
    return kinds


def s3_requests(log_path: Path, start: int) -> tuple[dict[str, int], int]:
    """S3 requests by method in moto's log from byte ``start``, and the log's end."""
    data = log_path.read_bytes()
    counts: dict[str, int] = {}
    for method in REQUEST.findall(data[start:].decode(errors="replace")):
        counts[method] = counts.get(method, 0) + 1
    return counts, len(data)


def run_mode(mode: str, arguments: argparse.Namespace, workdir: Path) -> ModeResult:
    result = ModeResult(mode)
    network = ZoneNetwork()
    try:
        network.build()
    except ZoneNetworkError as error:
        result.reason = str(error)
        return result
    settings = ClusterSettings(
        data_dir=workdir / f"router-{mode}",
        # make cluster turns the router on; the router-off run turns it off again (the
        # user's overrides win), the Kafka-like placement
        overrides=(
            "s3.wal.capacity=67108864",
            *(() if mode == "on" else ("automq.zonerouter.channels=",)),
        ),
        network=network,
    )
    kind = RoutedCluster if mode == "on" else LocalCluster
    cluster = kind(settings, threading.Event(), lambda line: log(f"  {line}"))
    try:
        log(f"router {mode}: starting the cluster in {network.instance}")
        cluster.start()
        result.report = measure(mode, arguments, network, settings, cluster, result)
        result.factor = result.report["cross_zone_per_produced_byte"]
    except (LaunchError, RuntimeError, OSError, ValueError, KeyError) as error:
        result.reason = f"{type(error).__name__}: {error}"
    finally:
        cluster.stop()
        network.close()
    return result


def measure(
    mode: str,
    arguments: argparse.Namespace,
    network: ZoneNetwork,
    settings: ClusterSettings,
    cluster: LocalCluster,
    result: ModeResult,
) -> dict[str, Any]:
    topic = f"cross-zone-{mode}"
    own = {zone: f"{settings.host(i)}:{settings.ports[i - 1]}" for i, zone in enumerate(ZONES, 1)}
    leaders = finished(
        python_in(
            network,
            "az1",
            "topic",
            "--bootstrap",
            settings.bootstrap,
            "--topic",
            topic,
            "--partitions",
            str(arguments.partitions),
        ),
        "creating the topic",
    )["leaders"]
    log(f"router {mode}: partition leaders {leaders}")
    # The cluster's own crossing with no client: what the brokers send one another idle.
    idle_before = network.counters()
    time.sleep(IDLE_S)
    idle = network.counters().minus(idle_before)
    start_at = time.time() + WARMUP_S
    workers = {
        zone: python_in(
            network,
            zone,
            "worker",
            "--zone",
            zone,
            "--bootstrap",
            own[zone],
            "--topic",
            topic,
            "--partitions",
            str(arguments.partitions),
            "--rate",
            str(arguments.rate),
            "--record-bytes",
            str(arguments.record_bytes),
            "--seconds",
            str(arguments.seconds),
            "--start-at",
            str(start_at),
            *(["--client-id", f"automq_az={zone}"] if mode == "on" else []),
        )
        for zone in ZONES
    }
    time.sleep(max(0.0, start_at - time.time()))
    assert cluster.moto is not None
    _, s3_start = s3_requests(cluster.moto.log_path, 0)
    before = network.counters()
    connections_before = connection_bytes(network)
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(SAMPLE_S):
            now = network.counters().minus(before)
            result.samples.append((now.at_s, now.cross_zone))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    answers = {
        zone: finished(process, f"the client in {zone}") for zone, process in workers.items()
    }
    stop_sampling.set()
    sampler.join(5)
    moved: Counters = network.counters().minus(before)
    by_kind = crossing_by_kind(connections_before, connection_bytes(network), set(settings.ports))
    requests, _ = s3_requests(cluster.moto.log_path, s3_start)
    acknowledged = sum(answer["acknowledged"] for answer in answers.values())
    produced = acknowledged * arguments.record_bytes
    if produced == 0:
        raise RuntimeError(f"nothing was acknowledged: {[a['failures'] for a in answers.values()]}")
    produce_ms = sorted(value for answer in answers.values() for value in answer["produce_ms"])
    e2e_ms = sorted(value for a in answers.values() for value in a["e2e_other_zones_ms"])
    factor = moved.cross_zone / produced
    # The payload that had to cross with this placement: records a producer sent to a leader in
    # another zone, and records a consumer read from one. With the router on every client talks
    # to its own zone's broker only, so none has to.
    led_in = {
        int(p): (ZONES[leader - 1] if mode == "off" else "everywhere")
        for p, leader in leaders.items()
    }
    payload_records = sum(
        count
        for zone, answer in answers.items()
        for key in ("acked_by_partition", "consumed_by_partition")
        for p, count in enumerate(answer[key])
        if led_in[p] not in (zone, "everywhere")
    )
    payload_factor = payload_records * arguments.record_bytes / produced
    return {
        "router": mode,
        "window_s": round(moved.at_s, 1),
        "records_acknowledged": acknowledged,
        "records_failed": sum(answer["failed"] for answer in answers.values()),
        "produced_bytes": produced,
        "cross_zone_bytes": moved.cross_zone,
        "cross_zone_per_produced_byte": round(factor, 4),
        "payload_cross_zone_per_produced_byte": round(payload_factor, 4),
        "framing_overhead": round(factor / payload_factor - 1, 4) if payload_factor else None,
        "per_zone": {
            zone: {
                "out_per_produced_byte": round(c.to_zones / produced, 4),
                "in_per_produced_byte": round(c.from_zones / produced, 4),
                "to_region_per_produced_byte": round(c.to_region / produced, 4),
                "from_region_per_produced_byte": round(c.from_region / produced, 4),
            }
            for zone, c in moved.zones.items()
        },
        "regional_per_produced_byte": round(moved.regional / produced, 4),
        "idle_cross_zone_bytes_per_s": round(idle.cross_zone / idle.at_s),
        "cross_zone_bytes_per_s": round(moved.cross_zone / moved.at_s),
        "crossing_tcp_payload_by_connection": by_kind,
        "produce_ms": {
            "p50": percentile(produce_ms, 0.5),
            "p99": percentile(produce_ms, 0.99),
        },
        "e2e_other_zone_ms": {
            "p50": percentile(e2e_ms, 0.5) if e2e_ms else None,
            "p99": percentile(e2e_ms, 0.99) if e2e_ms else None,
            "records": len(e2e_ms),
        },
        "consumed": {zone: answer["consumed"] for zone, answer in answers.items()},
        "s3_requests": requests,
        "s3_requests_per_gb": round(sum(requests.values()) / (produced / GIGABYTE), 1),
        "monthly_cross_zone_usd": round(monthly_cost(arguments.throughput_mib, factor)),
    }


# ------------------------------------------------------------------------------ the report


def print_report(results: list[ModeResult], arguments: argparse.Namespace) -> None:
    print(
        f"workload: per zone one producer ({arguments.rate} records/s of {arguments.record_bytes} "
        f"B, acks=all, {arguments.seconds} s) and one consumer of all {arguments.partitions} "
        "partitions; each client bootstraps from its own zone's broker"
    )
    for result in results:
        if result.factor is None:
            print(f"router {result.mode}: no figure ({result.reason})")
            continue
        r = result.report
        print(f"router {result.mode}:")
        print(
            f"  cross-zone bytes per produced byte: {r['cross_zone_per_produced_byte']} "
            f"({r['cross_zone_bytes']} B over {r['produced_bytes']} B acknowledged, "
            f"{r['window_s']} s); the payload alone, from the placement: "
            f"{r['payload_cross_zone_per_produced_byte']} "
            + (
                f"(headers, requests, answers and background add {r['framing_overhead']})"
                if r["framing_overhead"] is not None
                else "(every client talks to its own zone's broker; what crosses is the brokers')"
            )
        )
        for zone, c in r["per_zone"].items():
            print(
                f"    {zone}: out {c['out_per_produced_byte']}, in {c['in_per_produced_byte']}; "
                f"to region {c['to_region_per_produced_byte']}, from region "
                f"{c['from_region_per_produced_byte']}"
            )
        print(
            f"  produce p50 {r['produce_ms']['p50']:.1f} ms, p99 {r['produce_ms']['p99']:.1f} ms; "
            f"end-to-end in another zone p50 {r['e2e_other_zone_ms']['p50']} ms, "
            f"p99 {r['e2e_other_zone_ms']['p99']} ms ({r['e2e_other_zone_ms']['records']} reads)"
        )
        print(
            f"    cross-zone bytes a second: {r['cross_zone_bytes_per_s']} over the window, "
            f"{r['idle_cross_zone_bytes_per_s']} idle ({IDLE_S:.0f} s before the clients)"
        )
        for kind, row in r["crossing_tcp_payload_by_connection"].items():
            print(
                f"    TCP payload across zones (brokers' open connections), {kind}: "
                f"{row['connections']} connections, "
                f"{row['request']} B from the side that opened them, {row['answer']} B back"
            )
        print(f"  S3 requests per GB produced: {r['s3_requests_per_gb']} ({r['s3_requests']})")
        print(
            f"  monthly cross-zone cost at {arguments.throughput_mib} MiB/s: "
            f"${r['monthly_cross_zone_usd']}"
        )
    print(
        f"seed 002's example, Kafka (3 replicas, clients over 3 zones) at "
        f"{SEED_THROUGHPUT_MIB_S} MiB/s: factor {SEED_KAFKA_FACTOR:.2f}, "
        f"${monthly_cost(SEED_THROUGHPUT_MIB_S, SEED_KAFKA_FACTOR):.0f} a month "
        f"(VMs ${SEED_VM_MONTHLY})"
    )


def plot(results: list[ModeResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for result in results:
        if result.samples:
            axes.plot(
                [t for t, _ in result.samples],
                [b / 1e6 for _, b in result.samples],
                label=f"router {result.mode}",
            )
    axes.set_xlabel("seconds since the producers started")
    axes.set_ylabel("cross-zone MB (kernel counters)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("role", nargs="?", choices=("bench", "worker", "topic"), default="bench")
    parser.add_argument("--router", choices=(*MODES, "both"), default="both")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=int, default=200, help="records a second per producer")
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--throughput-mib", type=float, default=SEED_THROUGHPUT_MIB_S)
    parser.add_argument("--quick", action="store_true", help="20 s at 100 records/s per zone")
    parser.add_argument("--keep", action="store_true", help="keep the clusters' data and logs")
    parser.add_argument("--out", type=Path, help="write the full report as JSON here")
    parser.add_argument("--plot", type=Path, help="plot cross-zone bytes over time (PNG)")
    # The worker's and the topic's own arguments.
    parser.add_argument("--zone", default="az1")
    parser.add_argument("--bootstrap", default="")
    parser.add_argument("--topic", default="")
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--client-id", default="")
    arguments = parser.parse_args(argv)
    if arguments.role == "worker":
        worker(arguments)
        return
    if arguments.role == "topic":
        create_topic(arguments)
        return
    if arguments.quick:
        arguments.seconds, arguments.rate = 20, 100
    reason = unavailable_reason()
    modes = MODES if arguments.router == "both" else (arguments.router,)
    results = []
    workdir = Path(tempfile.mkdtemp(prefix="cross-zone-bench-"))
    try:
        for mode in modes:
            if reason is not None:
                log(f"router {mode}: no figure: {reason}")
                results.append(ModeResult(mode, reason=reason))
                continue
            result = run_mode(mode, arguments, workdir)
            if result.factor is None:
                log(f"router {mode}: no figure: {result.reason}")
            results.append(result)
    finally:
        if arguments.keep:
            log(f"data and logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_report(results, arguments)
    if arguments.out is not None:
        arguments.out.write_text(
            json.dumps({r.mode: r.report or {"reason": r.reason} for r in results}, indent=2)
        )
    if arguments.plot is not None:
        plot(results, arguments.plot)
    by_mode = {result.mode: result.factor for result in results}
    print(
        json.dumps(
            {
                "router_off_cross_zone_per_produced_byte": by_mode.get("off"),
                "router_on_cross_zone_per_produced_byte": by_mode.get("on"),
            }
        )
    )


if __name__ == "__main__":
    main()
