"""The advertised ApiVersions table is Kafka 4.0's for every key the broker implements (but
EndTxn v5, KIP-890 part 2's epoch bump at every transaction's end, which this coordinator does
not make: its clients stay on v4, the protocol of Kafka 3.x), and kio can decode every
advertised version this broker serves. The telemetry APIs are served and not advertised, as a
Kafka 4.0 broker without a telemetry receiver; the keys a Kafka 4.0 broker serves (answered
UNSUPPORTED_VERSION here when not served) are its table's."""

from __future__ import annotations

from kafka.protocol.broker_version_data import BROKER_API_VERSIONS
from kio.index import load_request_schema

from automq_ref.kafka.dispatch import (
    API_VERSIONS,
    KAFKA_BROKER_APIS_NOT_SERVED,
    ROUTES,
    UNADVERTISED_KEYS,
)
from automq_ref.kafka.request import ApiKey

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


TELEMETRY = {ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, ApiKey.PUSH_TELEMETRY}


def test_telemetry_is_served_not_advertised() -> None:
    kafka_4_0 = BROKER_API_VERSIONS[(4, 0)]
    for key in TELEMETRY:
        assert key in ROUTES and key in UNADVERTISED_KEYS
        assert key not in API_VERSIONS and key not in kafka_4_0
    advertised = {int(k) for k in ROUTES} - {int(k) for k in UNADVERTISED_KEYS}
    assert set(API_VERSIONS) == advertised


def test_the_apis_answered_unsupported_are_the_rest_of_kafka_4_0s_table() -> None:
    kafka_4_0 = BROKER_API_VERSIONS[(4, 0)]
    served = {int(key) for key in ROUTES}
    assert dict(KAFKA_BROKER_APIS_NOT_SERVED) == {
        key: versions for key, versions in kafka_4_0.items() if key not in served
    }
