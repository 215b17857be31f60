"""Partition placement and balancing: which live broker each partition goes to, as arithmetic.

The controller (the StreamMetadata machine's placement handlers) decides where partitions live
and writes the decision as records; this module only computes. It knows brokers (id and rack),
an assignment (partition -> broker) and, for balancing, the load of each partition, and returns
new brokers for some partitions. Pure and deterministic: the same inputs give the same moves,
so a controller that replays the log and decides again decides the same.

Every partition of AutoMQ has one replica: a partition *is* the broker that holds its streams,
and moving it copies nothing (the new broker opens the streams at a higher epoch). So placement
is about counts and load only, never about copying cost.

The rules, each the smallest change that does the job:

- **New partitions** (``place_partitions``): each goes to the live broker with the fewest
  partitions in the whole cluster; among equals, to one on another rack than the previous
  partition's, then the first in the *rack order* (racks by name, their brokers by id, dealt one
  rack at a time: ``a1, b1, c1, a2, b2, ...``). Consecutive partitions of a topic thus land on
  different racks whenever the counts allow, and cluster-wide counts stay within one of each
  other if they were.
- **A broker leaves** (fenced, shut down, unregistered, restarted: ``move_off``): only the
  partitions that are on no live broker move, each to the live broker with the fewest partitions
  (same tie-breaks). Nothing else moves.
- **A broker shuts down** (controlled shutdown, ``drain``): its partitions stay on it, held
  (no other rule moves them), and leave in batches, one batch per round (the controller runs a
  round at the shutdown request and then once a second), AutoMQ's batch:
  ``max(ceil(leaders / 60), 100)`` of its partitions, lowest keys first, each to the live broker
  with the fewest partitions (same tie-breaks), so even a broker leading thousands is drained
  within about a minute without moving everything in one decision. With no live broker left
  there is nowhere to spread the load: all of them are left with none at once.
- **A broker joins** (``share_with``): it takes partitions, one at a time, from the broker with
  the most partitions (ties: the busier by reported load, then the lower id) until no broker has
  two more than it: exactly as many moves as it takes to give it its share.
- **Balancing by count** (``balance_counts``, used when no load is reported): from the broker
  with the most partitions to the one with the fewest, while they differ by two or more.
- **Balancing by load** (``balance_loads``, AutoMQ's autobalancer goals for network in and out):
  a broker whose load on a resource is above ``mean * (1 + deviation)`` and above the detect
  threshold gives a partition to another broker. The move must relieve it: on that resource the
  receiver ends below where the giver started. On every other resource the partition loads, the
  receiver must also end below where the giver started, or stay within that resource's goal
  range (at most ``mean * (1 + deviation)``, or below the threshold): a move for one goal never
  breaks the other, and no peak rises above its goal range. And the move must strictly lower
  the sum of the squared loads (each resource scaled by its mean). That sum can only fall
  finitely often, so a round ends, and no move is ever undone by a later one (no ping-pong).
  Among the allowed moves the one that lowers the sum most is taken. At most ``max_moves``
  partitions move per round (AutoMQ's ``autobalancer.controller.execution.steps``).

Racks matter to new partitions and to partitions that must move; the balancing moves look at
counts and load only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

PartitionKey: TypeAlias = tuple[str, int]  # (topic id, partition index)
Assignment: TypeAlias = Mapping[PartitionKey, int]  # partition -> broker (NO_BROKER: none)
NO_BROKER: Final = -1


@dataclass(frozen=True, slots=True)
class Broker:
    """A live broker as placement sees it."""

    node_id: int
    rack: str


@dataclass(frozen=True, slots=True)
class Load:
    """A partition's traffic, as its broker last reported it."""

    bytes_in_per_sec: int
    bytes_out_per_sec: int

    def of(self, resource: int) -> int:
        return self.bytes_in_per_sec if resource == NETWORK_IN else self.bytes_out_per_sec


NETWORK_IN: Final = 0
NETWORK_OUT: Final = 1
RESOURCES: Final = (NETWORK_IN, NETWORK_OUT)
NO_LOAD: Final = Load(0, 0)


@dataclass(frozen=True, slots=True)
class BalanceParams:
    """The autobalancer's settings (AutoMQ's ``autobalancer.controller.*`` names and defaults):
    ``network.{in,out}.distribution.detect.avg.deviation`` (0.2: the goal range is the mean
    +-20 %), ``network.{in,out}.usage.distribution.detect.threshold`` (1 MiB/s: a broker below
    it is never relieved) and ``execution.steps`` (60 moves at most per round)."""

    network_in_avg_deviation: float = 0.2
    network_out_avg_deviation: float = 0.2
    network_in_threshold_bytes_per_sec: int = 1024 * 1024
    network_out_threshold_bytes_per_sec: int = 1024 * 1024
    max_moves: int = 60

    def deviation(self, resource: int) -> float:
        if resource == NETWORK_IN:
            return self.network_in_avg_deviation
        return self.network_out_avg_deviation

    def threshold(self, resource: int) -> int:
        if resource == NETWORK_IN:
            return self.network_in_threshold_bytes_per_sec
        return self.network_out_threshold_bytes_per_sec


DEFAULT_BALANCE_PARAMS: Final = BalanceParams()


# ------------------------------------------------------------------------------- helpers


def rack_order(brokers: Collection[Broker]) -> list[Broker]:
    """Racks by name, each rack's brokers by id, dealt one rack at a time (``a1, b1, a2, b2``).

    post: sorted(b.node_id for b in __return__) == sorted(b.node_id for b in brokers)
    """
    by_rack: dict[str, list[Broker]] = {}
    for broker in sorted(brokers, key=lambda b: (b.rack, b.node_id)):
        by_rack.setdefault(broker.rack, []).append(broker)
    racks = [by_rack[rack] for rack in sorted(by_rack)]
    ordered: list[Broker] = []
    for round_index in range(max((len(members) for members in racks), default=0)):
        ordered.extend(members[round_index] for members in racks if round_index < len(members))
    return ordered


def partition_counts(brokers: Iterable[Broker], assignment: Assignment) -> dict[int, int]:
    """Partitions per live broker (a live broker with none counts 0)."""
    counts = {broker.node_id: 0 for broker in brokers}
    for node_id in assignment.values():
        if node_id in counts:
            counts[node_id] += 1
    return counts


def _pick(ordered: Sequence[Broker], counts: Mapping[int, int], avoid_rack: str | None) -> Broker:
    """The broker with the fewest partitions; among equals one not on ``avoid_rack``, then the
    first in ``ordered``."""
    fewest = min(counts[broker.node_id] for broker in ordered)
    candidates = [broker for broker in ordered if counts[broker.node_id] == fewest]
    elsewhere = [broker for broker in candidates if broker.rack != avoid_rack]
    return (elsewhere or candidates)[0]


# ------------------------------------------------------------------------------ placement


def place_partitions(
    brokers: Collection[Broker], assignment: Assignment, count: int
) -> tuple[int, ...]:
    """Brokers for ``count`` new partitions (in index order), given the cluster's assignment.

    Empty when no broker is live (the caller refuses the request)."""
    if not brokers:
        return ()
    ordered = rack_order(brokers)
    counts = partition_counts(brokers, assignment)
    chosen: list[int] = []
    previous_rack: str | None = None
    for _ in range(count):
        broker = _pick(ordered, counts, previous_rack)
        counts[broker.node_id] += 1
        previous_rack = broker.rack
        chosen.append(broker.node_id)
    return tuple(chosen)


def move_off(
    brokers: Collection[Broker], assignment: Assignment, held: Collection[int] = ()
) -> dict[PartitionKey, int]:
    """New brokers for the partitions on no live broker (their broker left, or none was live):
    only those move, each to the live broker with the fewest partitions. With no live broker
    they are left with none (``NO_BROKER``). The partitions of the brokers ``held`` (shutting
    down: :func:`drain` moves theirs) stay where they are."""
    live = {broker.node_id for broker in brokers}
    stranded = sorted(
        key for key, node_id in assignment.items() if node_id not in live and node_id not in held
    )
    if not brokers:
        return {key: NO_BROKER for key in stranded if assignment[key] != NO_BROKER}
    ordered = rack_order(brokers)
    counts = partition_counts(brokers, assignment)
    racks = {broker.node_id: broker.rack for broker in brokers}
    moves: dict[PartitionKey, int] = {}
    previous_rack: str | None = None
    for key in stranded:
        broker = _pick(ordered, counts, previous_rack)
        counts[broker.node_id] += 1
        previous_rack = racks[broker.node_id]
        moves[key] = broker.node_id
    return moves


# AutoMQ's controlled shutdown: a round moves max(ceil(leaders / ROUNDS), MIN) partitions.
SHUTDOWN_BATCH_ROUNDS: Final = 60
SHUTDOWN_BATCH_MIN: Final = 100


def shutdown_batch_size(leaders: int) -> int:
    """How many of its ``leaders`` partitions a shutting-down broker gives up in one round.

    post: __return__ >= min(leaders, SHUTDOWN_BATCH_MIN)
    post: __return__ * SHUTDOWN_BATCH_ROUNDS >= leaders
    """
    return max(-(-leaders // SHUTDOWN_BATCH_ROUNDS), SHUTDOWN_BATCH_MIN)


def drain(
    brokers: Collection[Broker], assignment: Assignment, draining: Collection[int]
) -> dict[PartitionKey, int]:
    """One round of controlled shutdowns: for each broker of ``draining``, its
    :func:`shutdown_batch_size` lowest partitions move as :func:`move_off` moves a broker's
    that left (all of them when no broker is live: they are left with none)."""
    batch: set[PartitionKey] = set()
    for node_id in sorted(set(draining)):
        mine = sorted(key for key, held_by in assignment.items() if held_by == node_id)
        batch.update(mine[: shutdown_batch_size(len(mine))] if brokers else mine)
    if not batch:
        return {}
    rest = {key: node_id for key, node_id in assignment.items() if node_id not in draining}
    moves = move_off(brokers, {**rest, **{key: assignment[key] for key in batch}})
    return {key: node_id for key, node_id in moves.items() if key in batch}


def _broker_loads(
    brokers: Iterable[Broker], assignment: Assignment, loads: Mapping[PartitionKey, Load]
) -> dict[int, list[int]]:
    totals = {broker.node_id: [0, 0] for broker in brokers}
    for key, node_id in assignment.items():
        if node_id in totals:
            load = loads.get(key, NO_LOAD)
            for resource in RESOURCES:
                totals[node_id][resource] += load.of(resource)
    return totals


def _topic_spread_key(
    key: PartitionKey, receiver: int, current: Mapping[PartitionKey, int]
) -> tuple[int, PartitionKey]:
    """Prefer a partition of a topic the receiver holds few of, then the lowest key."""
    same_topic = sum(
        1 for other, node_id in current.items() if other[0] == key[0] and node_id == receiver
    )
    return same_topic, key


def _move_one_by_count(
    current: dict[PartitionKey, int], giver: int, receiver: int, loads: Mapping[PartitionKey, Load]
) -> PartitionKey:
    """The partition ``giver`` hands ``receiver`` when only counts matter: of a topic the
    receiver holds few of, then the least loaded, then the lowest key."""
    mine = [key for key, node_id in current.items() if node_id == giver]

    def order(key: PartitionKey) -> tuple[int, int, PartitionKey]:
        spread, _ = _topic_spread_key(key, receiver, current)
        load = loads.get(key, NO_LOAD)
        return spread, load.bytes_in_per_sec + load.bytes_out_per_sec, key

    chosen = min(mine, key=order)
    current[chosen] = receiver
    return chosen


def share_with(
    brokers: Collection[Broker],
    assignment: Assignment,
    joined: int,
    loads: Mapping[PartitionKey, Load] | None = None,
) -> dict[PartitionKey, int]:
    """Moves that give the live broker ``joined`` its share: partitions from the broker with
    the most (the busier by load among equals, then the lower id), one at a time, until no
    broker has two more than ``joined``. Only ``joined`` receives."""
    loads = loads or {}
    live = {broker.node_id for broker in brokers}
    if joined not in live:
        return {}
    current = {key: node_id for key, node_id in assignment.items() if node_id in live}
    counts = partition_counts(brokers, current)
    busy = {node_id: sum(load) for node_id, load in _broker_loads(brokers, current, loads).items()}
    moves: dict[PartitionKey, int] = {}
    while True:
        giver = min(
            (node_id for node_id in counts if node_id != joined),
            key=lambda node_id: (-counts[node_id], -busy[node_id], node_id),
            default=None,
        )
        if giver is None or counts[giver] - counts[joined] <= 1:
            return moves
        key = _move_one_by_count(current, giver, joined, loads)
        counts[giver] -= 1
        counts[joined] += 1
        moved = loads.get(key, NO_LOAD)
        busy[giver] -= moved.bytes_in_per_sec + moved.bytes_out_per_sec
        moves[key] = joined


def balance_counts(
    brokers: Collection[Broker], assignment: Assignment, max_moves: int
) -> dict[PartitionKey, int]:
    """Moves from the broker with the most partitions to the one with the fewest (ties: lower
    id), while they differ by two or more, at most ``max_moves`` partitions."""
    live = {broker.node_id for broker in brokers}
    current = {key: node_id for key, node_id in assignment.items() if node_id in live}
    counts = partition_counts(brokers, current)
    moves: dict[PartitionKey, int] = {}
    while counts and len(moves) < max_moves:
        giver = min(counts, key=lambda node_id: (-counts[node_id], node_id))
        receiver = min(counts, key=lambda node_id: (counts[node_id], node_id))
        if counts[giver] - counts[receiver] <= 1:
            break
        key = _move_one_by_count(current, giver, receiver, {})
        counts[giver] -= 1
        counts[receiver] += 1
        moves[key] = receiver
    return {key: node_id for key, node_id in moves.items() if assignment[key] != node_id}


# -------------------------------------------------------------------------- load balancing


@dataclass(frozen=True, slots=True)
class _Move:
    gain: float
    key: PartitionKey
    receiver: int


def balance_potential(
    brokers: Collection[Broker], assignment: Assignment, loads: Mapping[PartitionKey, Load]
) -> float:
    """The sum of the squared broker loads, each resource scaled by its mean: what every
    balancing move lowers."""
    totals = _broker_loads(brokers, assignment, loads)
    scales = _scales(totals)
    return sum((load[r] / scales[r]) ** 2 for load in totals.values() for r in RESOURCES)


def _scales(totals: Mapping[int, list[int]]) -> list[float]:
    count = max(len(totals), 1)
    return [max(sum(load[r] for load in totals.values()) / count, 1.0) for r in RESOURCES]


def goal_bound(totals: Mapping[int, Sequence[int]], resource: int, params: BalanceParams) -> float:
    """The top of a resource's goal range: ``mean * (1 + deviation)``, or the detect threshold
    when that is higher (a broker below it is never relieved)."""
    mean = sum(load[resource] for load in totals.values()) / max(len(totals), 1)
    return max(mean * (1 + params.deviation(resource)), float(params.threshold(resource)))


def _best_move(
    giver: int,
    current: Mapping[PartitionKey, int],
    totals: Mapping[int, list[int]],
    loads: Mapping[PartitionKey, Load],
    resource: int,
    scales: Sequence[float],
    bounds: Sequence[float],
) -> _Move | None:
    """The allowed move off ``giver`` that lowers the balance potential most, if any."""
    best: _Move | None = None
    giver_load = totals[giver]
    for key in sorted(k for k, node_id in current.items() if node_id == giver):
        load = loads.get(key, NO_LOAD)
        if load.of(resource) <= 0:
            continue
        for receiver in sorted(totals):
            if receiver == giver:
                continue
            after = [totals[receiver][r] + load.of(r) for r in RESOURCES]
            relieves = after[resource] < giver_load[resource]
            harmless = all(
                load.of(r) == 0 or after[r] < giver_load[r] or after[r] <= bounds[r]
                for r in RESOURCES
            )
            if not (relieves and harmless):
                continue
            gain = sum(
                2 * load.of(r) * (giver_load[r] - after[r]) / scales[r] ** 2 for r in RESOURCES
            )
            if gain > 0 and (best is None or gain > best.gain):
                best = _Move(gain, key, receiver)
    return best


def _overloaded(totals: Mapping[int, list[int]], params: BalanceParams) -> list[tuple[int, int]]:
    """(broker, resource) pairs above the goal range and the detect threshold, the worst
    first."""
    count = len(totals)
    found: list[tuple[float, int, int]] = []
    for resource in RESOURCES:
        mean = sum(load[resource] for load in totals.values()) / count
        upper = mean * (1 + params.deviation(resource))
        for node_id, load in totals.items():
            value = load[resource]
            if value > upper and value > params.threshold(resource):
                found.append((value / upper, node_id, resource))
    found.sort(key=lambda item: (-item[0], item[1], item[2]))
    return [(node_id, resource) for _, node_id, resource in found]


def balance_loads(
    brokers: Collection[Broker],
    assignment: Assignment,
    loads: Mapping[PartitionKey, Load],
    params: BalanceParams = DEFAULT_BALANCE_PARAMS,
) -> dict[PartitionKey, int]:
    """One round of the autobalancer: moves off brokers above the goal range (see the module
    docstring), at most ``params.max_moves`` partitions."""
    live = {broker.node_id for broker in brokers}
    if len(live) < 2:
        return {}
    current = {key: node_id for key, node_id in assignment.items() if node_id in live}
    totals = _broker_loads(brokers, current, loads)
    scales = _scales(totals)
    bounds = [goal_bound(totals, r, params) for r in RESOURCES]  # the means never change
    moved: set[PartitionKey] = set()
    while len(moved) < params.max_moves:
        move = None
        for giver, resource in _overloaded(totals, params):
            move = _best_move(giver, current, totals, loads, resource, scales, bounds)
            if move is not None:
                break
        if move is None:
            break
        load = loads.get(move.key, NO_LOAD)
        giver = current[move.key]
        for r in RESOURCES:
            totals[giver][r] -= load.of(r)
            totals[move.receiver][r] += load.of(r)
        current[move.key] = move.receiver
        moved.add(move.key)
    return {key: current[key] for key in sorted(moved) if current[key] != assignment[key]}
