"""What this broker does not implement, answered with the Kafka error that makes clients stop.

A client that asks for a missing feature should fail at once and say why, not retry until its
own timeout: each answer here is an error the clients treat as fatal (checked against
confluent-kafka/librdkafka, kafka-python and aiokafka), with a message where the response has
room for one, and the broker logs the reason once per client (:mod:`automq_ref.kafka.notices`).

- **Config changes to anything but a topic** (a broker, a broker logger, a group, client
  metrics): ``INVALID_REQUEST`` per resource, with a message saying how to change the setting
  instead.
"""

from __future__ import annotations

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.notices import unsupported_request
from automq_ref.kafka.request import Context, Request

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
BROKER_LOGGER_RESOURCE = 8
_RESOURCE_NAMES = {
    TOPIC_RESOURCE: "topic",
    BROKER_RESOURCE: "broker",
    BROKER_LOGGER_RESOURCE: "broker logger",
    16: "client metrics",
    32: "group",
}


def config_resource_refusal(
    context: Context, request: Request, api: str, resource_type: int
) -> str | None:
    """None for a topic, whose configs can be changed; otherwise the message to answer the
    resource with (``INVALID_REQUEST``), logged once per client."""
    if resource_type == TOPIC_RESOURCE:
        return None
    kind = _RESOURCE_NAMES.get(resource_type, f"resource type {resource_type}")
    if resource_type == BROKER_RESOURCE:
        message = (
            "broker configs cannot be changed while the broker runs; set them in its "
            "properties file (--config) or with --override and restart it"
        )
    elif resource_type == BROKER_LOGGER_RESOURCE:
        message = (
            "broker loggers cannot be changed while the broker runs; start it with "
            "--log-level debug|info|warning"
        )
    else:
        message = f"{kind} configs are not supported by this broker; only topic configs are"
    unsupported_request(
        context.notices,
        f"{kind} configs",
        client_id=request.client_id,
        host=request.peer.host,
        api=api,
        error=KafkaErrorCode.INVALID_REQUEST.name,
        hint=message,
    )
    return message
