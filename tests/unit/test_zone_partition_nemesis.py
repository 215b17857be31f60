"""The zone-partition nemesis's choice of connections: which zone a Kafka connection comes from
(by its first request's client id) and which connections a cut of one zone holds at each
broker's proxy. The nemesis in a running cluster: tests/linearizability/test_cluster_workload.py.
"""

from __future__ import annotations

import pytest

from automq_ref.checker.nemesis import NEMESES, _zone_cut, connection_zone


@pytest.mark.parametrize(
    ("client_id", "zone"),
    [
        ("automq_az=az2", "az2"),
        ("app=billing&automq_az=az3&automq_type=producer", "az3"),
        ("automq-ref-router-1", "az1"),  # broker 1's zone router
        ("snapshot-read-3", "az3"),  # broker 3's snapshot reads
        ("rdkafka", None),
        ("", None),
        ("xautomq_az=az2", None),
        ("automq-ref-router-", None),
    ],
)
def test_a_connection_s_zone_comes_from_its_client_id(client_id: str, zone: str | None) -> None:
    assert connection_zone(client_id) == zone


def test_a_cut_zone_is_held_apart_from_the_others_and_reaches_itself() -> None:
    at_az2, at_az1 = _zone_cut("az2", "az2"), _zone_cut("az1", "az2")
    # Into the cut zone's broker: only its own zone passes.
    assert not at_az2("automq_az=az2")
    assert at_az2("automq_az=az1") and at_az2("automq-ref-router-3") and at_az2("snapshot-read-1")
    # Into another zone's broker: the cut zone's clients and broker are held, the rest pass.
    assert at_az1("automq_az=az2") and at_az1("automq-ref-router-2") and at_az1("snapshot-read-2")
    assert not at_az1("automq_az=az1") and not at_az1("automq_az=az3")
    assert not at_az1("automq-ref-router-3")
    # A client without a zone is not cut anywhere (the final read, the admin client).
    assert not at_az2("rdkafka") and not at_az1("rdkafka")


def test_the_nemesis_needs_a_cluster_its_proxies_and_the_zone_router() -> None:
    nemesis = NEMESES["zone-partition"]
    assert nemesis.needs_cluster and nemesis.needs_proxies and nemesis.needs_zone_router
    assert NEMESES["net"].needs_proxies and not NEMESES["net"].needs_zone_router
