"""The server-side assignors of KIP-848 consumer groups: ``uniform`` (the default) and
``range``, Kafka's two names (``group.consumer.assignors``). Each maps the members'
subscriptions over the subscribed topics' partitions to a target assignment; both are pure and
deterministic (ties go to the smaller member id), and every partition of a subscribed topic goes
to exactly one member subscribed to it.

``uniform`` is sticky: a member keeps what its previous target gave it while it still
subscribes to the topic, new or freed partitions go to the eligible member holding the fewest,
then partitions move one at a time from a member holding at least two more than an eligible
other until none does; with identical subscriptions the members' counts then differ by one at
most. ``range`` gives each member, topic by topic, a contiguous range of the topic's partitions
(members in id order, the first ``partitions % members`` one more), so members subscribed to the
same topics get the same partition numbers of each (co-partitioned joins).
"""

from __future__ import annotations

from collections.abc import Mapping

from automq_ref.state_machines.group.consumer_state import Partitions
from automq_ref.state_machines.group.events import TopicPartition

UNIFORM = "uniform"
RANGE = "range"
ASSIGNORS = (UNIFORM, RANGE)


def assign(
    assignor: str,
    subscriptions: Mapping[str, frozenset[str]],
    topics: Mapping[str, int],
    previous: Mapping[str, Partitions],
) -> dict[str, Partitions]:
    """The target assignment of ``subscriptions`` (member id -> subscribed topic names) over
    ``topics`` (topic -> partition count; topics it lacks are not assigned), given the
    ``previous`` target; every member gets an entry."""
    if assignor == RANGE:
        return _range(subscriptions, topics)
    return _uniform(subscriptions, topics, previous)


def _range(
    subscriptions: Mapping[str, frozenset[str]], topics: Mapping[str, int]
) -> dict[str, Partitions]:
    result: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    for topic in sorted({t for names in subscriptions.values() for t in names}):
        count = topics.get(topic)
        if not count:
            continue
        members = sorted(m for m, names in subscriptions.items() if topic in names)
        quota, extra = divmod(count, len(members))
        start = 0
        for index, member in enumerate(members):
            size = quota + (1 if index < extra else 0)
            result[member].update((topic, p) for p in range(start, start + size))
            start += size
    return {m: frozenset(tps) for m, tps in result.items()}


def _uniform(
    subscriptions: Mapping[str, frozenset[str]],
    topics: Mapping[str, int],
    previous: Mapping[str, Partitions],
) -> dict[str, Partitions]:
    members = sorted(subscriptions)
    load: dict[str, set[TopicPartition]] = {m: set() for m in members}
    owner: dict[TopicPartition, str] = {}

    def valid(member: str, tp: TopicPartition) -> bool:
        return tp[0] in subscriptions[member] and 0 <= tp[1] < topics.get(tp[0], 0)

    for member in members:  # sticky: what the previous target gave, while still valid
        for tp in sorted(previous.get(member, ())):
            if tp not in owner and valid(member, tp):
                owner[tp] = member
                load[member].add(tp)
    every = [
        (topic, p)
        for topic in sorted({t for names in subscriptions.values() for t in names})
        for p in range(topics.get(topic, 0))
    ]
    for tp in every:
        if tp in owner:
            continue
        eligible = [m for m in members if tp[0] in subscriptions[m]]
        chosen = min(eligible, key=lambda m: (len(load[m]), m))
        owner[tp] = chosen
        load[chosen].add(tp)
    # Balance: move one partition at a time from a member holding at least two more than an
    # eligible receiver (each move lowers the sum of squared loads, so this ends).
    moved = True
    while moved:
        moved = False
        for donor in sorted(members, key=lambda m: (-len(load[m]), m)):
            for tp in sorted(load[donor], reverse=True):
                receivers = [
                    m
                    for m in members
                    if tp[0] in subscriptions[m] and len(load[m]) + 2 <= len(load[donor])
                ]
                if receivers:
                    receiver = min(receivers, key=lambda m: (len(load[m]), m))
                    load[donor].discard(tp)
                    load[receiver].add(tp)
                    moved = True
                    break
            if moved:
                break
    return {m: frozenset(tps) for m, tps in load.items()}
