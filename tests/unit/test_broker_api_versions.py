"""The advertised ApiVersions table is Kafka 4.0's for every key the broker implements (but
EndTxn v5, KIP-890 part 2's epoch bump at every transaction's end, which this coordinator does
not make: its clients stay on v4, the protocol of Kafka 3.x), and kio can decode every
advertised version this broker serves."""

from __future__ import annotations

from kafka.protocol.broker_version_data import BROKER_API_VERSIONS
from kio.index import load_request_schema

from automq_ref.kafka.dispatch import API_VERSIONS

END_TXN = 26
BELOW_KAFKA_4_0 = {END_TXN: (0, 4)}


def test_ranges_are_kafka_4_0s() -> None:
    kafka_4_0 = BROKER_API_VERSIONS[(4, 0)]
    for api_key, versions in API_VERSIONS.items():
        assert BELOW_KAFKA_4_0.get(api_key, kafka_4_0[api_key]) == versions, f"API key {api_key}"
    assert kafka_4_0[END_TXN] == (0, 5)


def test_every_served_version_decodes() -> None:
    for api_key, (low, high) in API_VERSIONS.items():
        first = 3 if api_key == 0 else low  # Produce v0-2: advertised, refused (as Kafka 4.0)
        for version in range(first, high + 1):
            load_request_schema(api_key, version)
