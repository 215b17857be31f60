"""DescribeConfigs and IncrementalAlterConfigs: topic configs (read and changed) and the broker's
settings (read only).

A topic config is reported with its source: set on the topic (DYNAMIC_TOPIC_CONFIG) or the
default (DEFAULT_CONFIG, the documented default or the broker's setting). Only SET and DELETE
apply: this broker has no list-valued topic configs for APPEND and SUBTRACT.
"""

from __future__ import annotations

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.handlers.unsupported import config_resource_refusal
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.responses import (
    CONFIG_SOURCE_DEFAULT,
    CONFIG_SOURCE_DYNAMIC_TOPIC,
    AlterConfigsResourceResponse,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribedConfig,
    IncrementalAlterConfigsResponse,
    respond,
)
from automq_ref.kafka.server import Reply
from automq_ref.kafka.topic_registry import ConfigChange
from automq_ref.kafka.topics import TOPIC_CONFIG_DEFAULTS, TopicError

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4


async def handle_describe_configs(context: Context, request: Request) -> Reply:
    registry = context.topics
    results = []
    for resource in request.body.resources:
        kind, name = int(resource.resource_type), resource.resource_name
        keys = resource.configuration_keys
        if kind == TOPIC_RESOURCE:
            topic = registry.topics.get(name)
            if topic is None:
                result = DescribeConfigsResult(
                    resource.resource_type,
                    name,
                    error_code=KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    error_message=f"no topic {name}",
                )
            else:
                configs = [
                    _entry(key, registry.topic_config(topic, key), key in topic.configs)
                    for key in sorted(TOPIC_CONFIG_DEFAULTS)
                    if keys is None or key in keys
                ]
                result = DescribeConfigsResult(resource.resource_type, name, configs)
        elif kind == BROKER_RESOURCE:
            values = context.config.model_dump(by_alias=True)
            configs = [
                _entry(key, str(value), False, read_only=True)
                for key, value in sorted(values.items())
                if keys is None or key in keys
            ]
            result = DescribeConfigsResult(resource.resource_type, name, configs)
        else:
            result = DescribeConfigsResult(
                resource.resource_type,
                name,
                error_code=KafkaErrorCode.INVALID_REQUEST,
                error_message=f"resource type {resource.resource_type} is not supported",
            )
        results.append(result)
    return respond(request, DescribeConfigsResponse(results))


def _entry(name: str, value: str, explicit: bool, *, read_only: bool = False) -> DescribedConfig:
    source = CONFIG_SOURCE_DYNAMIC_TOPIC if explicit else CONFIG_SOURCE_DEFAULT
    return DescribedConfig(name, value, source, read_only=read_only)


async def handle_incremental_alter_configs(context: Context, request: Request) -> Reply:
    body = request.body
    responses = []
    for resource in body.resources:
        try:
            refusal = config_resource_refusal(
                context, request, "IncrementalAlterConfigs", int(resource.resource_type)
            )
            if refusal is not None:
                raise TopicError(KafkaErrorCode.INVALID_REQUEST, refusal)
            changes = [
                ConfigChange(change.name, int(change.config_operation), change.value)
                for change in resource.configs
            ]
            await context.topics.alter_configs(
                resource.resource_name, changes, validate_only=bool(body.validate_only)
            )
        except TopicError as error:
            responses.append(
                AlterConfigsResourceResponse(
                    resource.resource_type,
                    resource.resource_name,
                    error_code=error.code,
                    error_message=str(error),
                )
            )
            continue
        responses.append(
            AlterConfigsResourceResponse(resource.resource_type, resource.resource_name)
        )
    return respond(request, IncrementalAlterConfigsResponse(responses))
