"""Two broker processes on one etcd and one object store: both serve, one is the controller;
killed, it is replaced within the lease's TTL plus a second, and topics can be created again.
A topic created through one broker is listed by the other (its topic registry follows the
metadata).

Each broker is ``automq-ref serve`` with its own node id, data directory and port, the same
``metadata.etcd.endpoints`` and ``cluster.id``, and the same local object store directory. The
controller is read from the election key in etcd; the takeover time is from the SIGKILL until
the key names the survivor.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from automq_ref.io.metadata.election import election_key
from automq_ref.io.metadata.etcd_client import EtcdClient
from tests.e2e.conftest import BrokerProcess
from tests.etcd_fixture import EtcdServer, running_etcd, unique_cluster_id

TTL_MS = 2000


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    with running_etcd() as server:
        yield server


def controller_node(endpoint: str, cluster_id: str) -> int | None:
    """The node id in the election key, or None while there is none."""

    async def read() -> int | None:
        client = await EtcdClient.connect([endpoint])
        try:
            found = await client.get(election_key(cluster_id))
        finally:
            await client.close()
        return None if found is None else int(json.loads(found.value)["node_id"])

    return asyncio.run(read())


def wait_for_controller(
    endpoint: str, cluster_id: str, among: set[int], timeout_s: float = 20
) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        node = controller_node(endpoint, cluster_id)
        if node in among:
            return node
        time.sleep(0.05)
    raise AssertionError(f"no controller among {among} in {timeout_s} s")


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions)], request_timeout=30).values():
        future.result(40)


def wait_for_topic(bootstrap: str, name: str, timeout_s: float = 20) -> None:
    """Until the broker at ``bootstrap`` lists topic ``name`` in its Metadata answers."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if name in admin.list_topics(timeout=10).topics:
            return
        time.sleep(0.05)
    raise AssertionError(f"topic {name} not listed by {bootstrap} in {timeout_s} s")


def test_two_brokers_one_controller_and_a_takeover(tmp_path: Path, etcd: EtcdServer) -> None:
    cluster_id = unique_cluster_id("failover")
    common = (
        f"metadata.etcd.endpoints={etcd.endpoint}",
        f"cluster.id={cluster_id}",
        f"s3.data.buckets={(tmp_path / 'objects').as_uri()}",
        f"controller.lease.ttl.ms={TTL_MS}",
    )
    brokers = {
        node_id: BrokerProcess(tmp_path / f"broker-{node_id}", *common, f"node.id={node_id}")
        for node_id in (1, 2)
    }
    try:
        for broker in brokers.values():
            broker.start()
        controller = wait_for_controller(etcd.endpoint, cluster_id, {1, 2})
        survivor = 3 - controller
        # A topic created through the broker that is not the controller: its requests go to
        # the controller over the controller RPC.
        create_topic(brokers[survivor].bootstrap, "before", 3)
        # The other broker follows the metadata: it lists the topic too.
        wait_for_topic(brokers[controller].bootstrap, "before")

        brokers[controller].kill()
        killed = time.monotonic()
        wait_for_controller(etcd.endpoint, cluster_id, {survivor}, TTL_MS / 1000 + 10)
        takeover_s = time.monotonic() - killed
        print(f"controller takeover after SIGKILL: {takeover_s:.2f} s (lease TTL {TTL_MS} ms)")
        assert takeover_s <= TTL_MS / 1000 + 1
        create_topic(brokers[survivor].bootstrap, "after", 2)

        # The killed broker comes back (its partitions recovered from its WAL) and follows.
        brokers[controller].start()
        assert controller_node(etcd.endpoint, cluster_id) == survivor
        create_topic(brokers[controller].bootstrap, "again", 1)
    finally:
        for broker in brokers.values():
            if broker.alive():
                broker.stop()
    for broker in brokers.values():
        assert not broker.unawaited_coroutines()
