"""The Kafka side's series of the metrics endpoint (:mod:`automq_ref.io.metrics`), read from the
broker's state when Prometheus scrapes, on the event loop that changes it.

Names and labels are those AutoMQ's Prometheus exporter gives the same series:

- ``kafka_network_io_bytes_total{topic, direction}`` and ``kafka_message_count_total{topic}``:
  the bytes produced (``in``) and fetched (``out``) and the records produced, per topic, on
  this broker. Each partition counts its own; the registry keeps the counts of the partitions
  that left (``TopicRegistry.traffic_before``), so a topic's series only grows while the topic
  exists (a deleted topic's series goes);
- ``kafka_partition_count`` (partitions led here), ``kafka_topic_count`` (topics of the
  cluster), ``kafka_log_end_offset{topic, partition}`` and ``kafka_log_start_offset{...}`` of
  each partition led here;
- ``kafka_controller_active_count``: 1 on the broker whose controller is the active one, 0
  elsewhere; there only, as AutoMQ's controller reports them, ``kafka_broker_active_count`` and
  ``kafka_broker_fenced_count``, the registered brokers that are live and fenced (a broker in
  controlled shutdown is neither);
- ``kafka_group_count`` and, per state, ``kafka_group_empty_count``,
  ``kafka_group_preparing_rebalance_count``, ``kafka_group_completing_rebalance_count``,
  ``kafka_group_stable_count`` of the groups coordinated here, and
  ``kafka_group_commit_offset{consumer_group, topic, partition}`` of their committed offsets;
- ``kafka_zone_router_cross_zone_bytes_total{direction, api, role}``: the bytes the zone router
  sends to (``out``) and receives from (``in``) brokers in other zones, frames with their size
  prefixes: as a proxy, its AutomqZoneRouter requests to the partitions' leaders
  (``api="AutomqZoneRouter"``, ``role="proxy"``) and its snapshot-read polls of its mains
  (``AutomqGetPartitionSnapshot``); as a main, the same requests taken from its proxies and
  answered (``role="main"``). Every one crosses zones: a proxy routes to, and polls, only mains
  of other zones (in its own zone a main is its own proxy). Zero with the router off.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from automq_ref.kafka.request import Context
from automq_ref.state_machines.group.state import GroupState

# The zone router's APIs between brokers, and the two ends of each.
ZONE_ROUTER, SNAPSHOT = "AutomqZoneRouter", "AutomqGetPartitionSnapshot"
PROXY, MAIN = "proxy", "main"
_STATE_SERIES = {
    GroupState.EMPTY: "kafka_group_empty_count",
    GroupState.PREPARING_REBALANCE: "kafka_group_preparing_rebalance_count",
    GroupState.COMPLETING_REBALANCE: "kafka_group_completing_rebalance_count",
    GroupState.STABLE: "kafka_group_stable_count",
}


class BrokerState(Collector):
    """The series above, of one broker (its topic registry, group coordinator and image)."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self._topics = context.topics
        self._groups = context.groups

    def collect(self) -> Iterator[Metric]:
        yield from self._traffic()
        yield from self._logs()
        yield from self._consumer_groups()
        yield from self._controller()
        yield self._cross_zone()

    def _cross_zone(self) -> Metric:
        context = self._context
        counts = {  # (api, role): (out, in)
            (ZONE_ROUTER, PROXY): (0, 0),
            (ZONE_ROUTER, MAIN): (0, 0),
            (SNAPSHOT, PROXY): (0, 0),
            (SNAPSHOT, MAIN): (0, 0),
        }
        if context.router_out is not None:
            links = context.router_out.links.values()
            counts[ZONE_ROUTER, PROXY] = (
                sum(link.bytes_out for link in links),
                sum(link.bytes_in for link in links),
            )
        if context.router_in is not None:
            counts[ZONE_ROUTER, MAIN] = (context.router_in.bytes_out, context.router_in.bytes_in)
        if context.snapshot_reads is not None:
            counts[SNAPSHOT, PROXY] = context.snapshot_reads.traffic()
        if context.snapshot_sessions is not None:
            sessions = context.snapshot_sessions
            counts[SNAPSHOT, MAIN] = (sessions.bytes_out, sessions.bytes_in)
        family = CounterMetricFamily(
            "kafka_zone_router_cross_zone_bytes",
            "Bytes the zone router sent to (out) and received from (in) other zones' brokers.",
            labels=["direction", "api", "role"],
        )
        for (api, role), (bytes_out, bytes_in) in counts.items():
            family.add_metric(["out", api, role], bytes_out)
            family.add_metric(["in", api, role], bytes_in)
        return family

    def _controller(self) -> Iterator[Metric]:
        context = self._context
        # Embedded (no etcd), the node's own controller is the one.
        embedded = not context.config.etcd_endpoints
        active = embedded or context.active_controller() == context.config.node_id
        yield GaugeMetricFamily(
            "kafka_controller_active_count",
            "1 on the broker whose controller is the active one.",
            value=int(active),
        )
        if not active:
            return
        brokers = context.view.image.brokers.values()
        yield GaugeMetricFamily(
            "kafka_broker_active_count",
            "Registered brokers that are live (the active controller's view).",
            value=sum(broker.live for broker in brokers),
        )
        yield GaugeMetricFamily(
            "kafka_broker_fenced_count",
            "Registered brokers that are fenced (the active controller's view).",
            value=sum(broker.fenced for broker in brokers),
        )

    def _traffic(self) -> Iterator[Metric]:
        registry = self._topics
        totals = {
            name: list(counts)
            for name, counts in registry.traffic_before.items()
            if name in registry.topics
        }
        for (name, _), partition in registry.partitions.items():
            counts = totals.setdefault(name, [0, 0, 0])
            counts[0] += partition.bytes_in
            counts[1] += partition.bytes_out
            counts[2] += partition.records_in
        io = CounterMetricFamily(
            "kafka_network_io_bytes",
            "Bytes produced to (in) and fetched from (out) each topic's partitions here.",
            labels=["topic", "direction"],
        )
        messages = CounterMetricFamily(
            "kafka_message_count", "Records produced to each topic here.", labels=["topic"]
        )
        for name, (bytes_in, bytes_out, records_in) in sorted(totals.items()):
            io.add_metric([name, "in"], bytes_in)
            io.add_metric([name, "out"], bytes_out)
            messages.add_metric([name], records_in)
        yield io
        yield messages

    def _logs(self) -> Iterator[Metric]:
        registry = self._topics
        partitions = sorted(registry.partitions.items())
        yield GaugeMetricFamily(
            "kafka_partition_count", "Partitions led by this broker.", value=len(partitions)
        )
        yield GaugeMetricFamily(
            "kafka_topic_count", "Topics of the cluster.", value=len(registry.topics)
        )
        end = GaugeMetricFamily(
            "kafka_log_end_offset",
            "The offset after the last record of each partition led here.",
            labels=["topic", "partition"],
        )
        start = GaugeMetricFamily(
            "kafka_log_start_offset",
            "The first offset still held by each partition led here.",
            labels=["topic", "partition"],
        )
        for (name, index), partition in partitions:
            end.add_metric([name, str(index)], partition.log_end_offset)
            start.add_metric([name, str(index)], partition.log_start_offset)
        yield end
        yield start

    def _consumer_groups(self) -> Iterator[Metric]:
        states = self._groups.serving_states()
        counts = dict.fromkeys(_STATE_SERIES, 0)
        offsets = GaugeMetricFamily(
            "kafka_group_commit_offset",
            "The committed offset of each partition of each group coordinated here.",
            labels=["consumer_group", "topic", "partition"],
        )
        total = 0
        for state in states:
            # A group with offsets and no members' state is Empty, as Kafka lists it.
            for group_id in state.groups.keys() | state.offsets.keys():
                group = state.groups.get(group_id)
                group_state = GroupState.EMPTY if group is None else group.state
                total += 1
                if group_state in counts:
                    counts[group_state] += 1
            for group_id, committed in sorted(state.offsets.items()):
                for (topic, index), offset in sorted(committed.items()):
                    offsets.add_metric([group_id, topic, str(index)], offset.offset)
        yield GaugeMetricFamily("kafka_group_count", "Groups coordinated here.", value=total)
        for group_state, series in _STATE_SERIES.items():
            yield GaugeMetricFamily(
                series,
                f"Groups coordinated here that are {group_state.value}.",
                value=counts[group_state],
            )
        yield offsets
