"""What the broker does not implement, tried with real clients: each fails at once (well inside
its own timeout) with an error that says why, and the broker logs the reason once per client,
however often the client retries.

An API key the broker does not serve and a version it does not speak (raw requests), and config
changes to anything but a topic (confluent-kafka, kafka-python); AlterConfigs, the older
non-incremental API, is served.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
import warnings

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kafka.admin import KafkaAdminClient
from kafka.admin._configs import ConfigResource as KpConfigResource
from kafka.admin._configs import ConfigResourceType

from tests.e2e.conftest import BrokerProcess

# Each client below would wait this long (or longer) if the broker let it retry.
CLIENT_TIMEOUT_S = 30.0
FAIL_FAST_S = 5.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def warnings_for(broker: BrokerProcess, client_id: str, text: str) -> list[str]:
    """The broker's WARNING lines naming ``client_id`` and containing ``text``."""
    log = broker.log_path.read_text(errors="replace")
    return [
        line
        for line in log.splitlines()
        if " WARNING " in line and f"client_id={client_id} " in line and text in line
    ]


def wait_for_warning(broker: BrokerProcess, client_id: str, text: str) -> list[str]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = warnings_for(broker, client_id, text)
        if found:
            return found
        time.sleep(0.1)
    return []


def raw_request(broker: BrokerProcess, api_key: int, version: int, client_id: str) -> bytes:
    """A request header with nothing after it; what the broker sent back before closing."""
    name = client_id.encode()
    payload = struct.pack(">hhih", api_key, version, 7, len(name)) + name + bytes(8)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
        return received


def test_an_unserved_api_closes_the_connection_and_is_told_once(broker: BrokerProcess) -> None:
    client_id = unique("raw")
    for _ in range(3):
        assert raw_request(broker, 41, 0, client_id) == b""  # DescribeDelegationToken
        assert raw_request(broker, 3, 99, client_id) == b""  # Metadata v99
    unserved = wait_for_warning(broker, client_id, "DescribeDelegationToken (API key 41)")
    assert len(unserved) == 1, unserved
    version = wait_for_warning(broker, client_id, "Metadata v99")
    assert len(version) == 1, version
    assert "v0-13" in version[0]


def one_response(broker: BrokerProcess, api_key: int, version: int, client_id: str) -> bytes:
    """A request header with nothing after it; the one response the broker sends back."""
    name = client_id.encode()
    payload = struct.pack(">hhih", api_key, version, 7, len(name)) + name + bytes(8)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        received = b""
        while len(received) < 4 or len(received) < 4 + struct.unpack_from(">i", received)[0]:
            chunk = sock.recv(4096)
            assert chunk, f"closed after {received!r}"
            received += chunk
        return received[4:]


def test_an_api_kafka_serves_is_answered_unsupported_and_told_once(
    broker: BrokerProcess,
) -> None:
    """DescribeDelegationToken v1 (a version Kafka 4.0 serves): answered UNSUPPORTED_VERSION in
    its response's error_code, not closed (v0 above, which Kafka 4.0 does not serve, is)."""
    client_id = unique("raw-tokens")
    for _ in range(3):
        response = one_response(broker, 41, 1, client_id)
        correlation_id, error_code = struct.unpack_from(">ih", response)
        assert (correlation_id, error_code) == (7, 35)
    told = wait_for_warning(broker, client_id, "DescribeDelegationToken (API key 41)")
    assert len(told) == 1, told
    assert "answer=UNSUPPORTED_VERSION" in told[0]


def test_config_changes_other_than_topics_say_what_to_do(broker: BrokerProcess) -> None:
    client_id = unique("ck-admin")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "client.id": client_id})
    broker_change = ConfigResource(
        ResourceType.BROKER,
        "0",
        incremental_configs=[
            ConfigEntry("log.retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for _ in range(2):
        started = time.monotonic()
        with pytest.raises(KafkaException) as raised:
            admin.incremental_alter_configs([broker_change])[broker_change].result(CLIENT_TIMEOUT_S)
        assert time.monotonic() - started < FAIL_FAST_S
        error = raised.value.args[0]
        assert error.code() == KafkaError.INVALID_REQUEST
        assert "--override" in error.str()
    assert len(wait_for_warning(broker, client_id, "broker configs cannot be changed")) == 1

    kp_client_id = unique("kp-admin")
    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id=kp_client_id)
    try:
        answer = kp_admin.alter_configs(
            [KpConfigResource(ConfigResourceType.BROKER_LOGGER, "0", {"kafka.server": "DEBUG"})],
            raise_on_unknown=False,
            incremental=True,
        )
    finally:
        kp_admin.close()
    refusal = str(answer["broker_logger"]["0"])
    assert "InvalidRequestError" in refusal and "--log-level" in refusal
    assert len(wait_for_warning(broker, kp_client_id, "broker loggers cannot be changed")) == 1


def test_alter_configs_replaces_a_topics_configs(broker: BrokerProcess) -> None:
    """The non-incremental AlterConfigs (librdkafka's ``alter_configs``; it used to fail in the
    client with "requires broker version >= 0.11.0"): the configs listed become the topic's
    whole set."""
    topic = unique("altered")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, config={"retention.ms": "60000"})])[topic].result()
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"max.message.bytes": "200000"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # deprecated in the client
        admin.alter_configs([resource])[resource].result(CLIENT_TIMEOUT_S)
    described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    configs = next(iter(described.values())).result(CLIENT_TIMEOUT_S)
    assert configs["max.message.bytes"].value == "200000"
    assert not configs["max.message.bytes"].is_default
    assert configs["retention.ms"].is_default  # not listed: back to its default
