"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs: topic configs (read and changed) and
the broker's settings (read only).

Every topic config of the catalog (:mod:`automq_ref.kafka.topic_configs`) is described, as
Kafka describes it: with its source (set on the topic: DYNAMIC_TOPIC_CONFIG; otherwise
DEFAULT_CONFIG, the broker's setting or Kafka's default), not sensitive, not read-only, its type
(v3+), its documentation when asked for (v3+) and its synonyms when asked for (the topic's own
setting, then the broker property that gives the default). An empty list of names asks for all
of them, as with Kafka. IncrementalAlterConfigs applies SET, DELETE, APPEND and SUBTRACT;
AlterConfigs replaces a topic's whole set; both answer each resource on its own, and a resource
named twice in one request is refused (INVALID_REQUEST) wherever it appears.

With an authorizer, a resource is described with DESCRIBE_CONFIGS and changed with
ALTER_CONFIGS on it, as Kafka checks them, before anything else: a topic on the topic (else
TOPIC_AUTHORIZATION_FAILED), a group on the group (GROUP_AUTHORIZATION_FAILED), a broker (or any
other type) on the cluster (CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.topic_record import Topic
from automq_ref.kafka.handlers.authorize import REFUSAL, AclOperation, ResourceType, allowed
from automq_ref.kafka.handlers.unsupported import config_resource_refusal
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.responses import (
    CONFIG_SOURCE_DEFAULT,
    CONFIG_SOURCE_DYNAMIC_TOPIC,
    AlterConfigsResourceResponse,
    AlterConfigsResponse,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribedConfig,
    DescribedSynonym,
    IncrementalAlterConfigsResponse,
    respond,
)
from automq_ref.kafka.server import Reply
from automq_ref.kafka.topic_configs import TOPIC_CONFIGS, ConfigChange, TopicConfig
from automq_ref.kafka.topics import TopicError
from automq_ref.state_machines.acl import CLUSTER_NAME

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
GROUP_RESOURCE = 32
_DENIED = {
    ResourceType.TOPIC: "Topic authorization failed.",
    ResourceType.GROUP: "Group authorization failed.",
    ResourceType.CLUSTER: "Cluster authorization failed.",
}


def _config_denied(
    context: Context, request: Request, operation: AclOperation, kind: int, name: str
) -> TopicError | None:
    """Why the principal may not describe or alter this config resource, or None."""
    if context.acls is None:
        return None
    if kind in (TOPIC_RESOURCE, GROUP_RESOURCE):
        resource = ResourceType.TOPIC if kind == TOPIC_RESOURCE else ResourceType.GROUP
    else:
        resource, name = ResourceType.CLUSTER, CLUSTER_NAME
    if allowed(context, request, operation, resource, name):
        return None
    return TopicError(REFUSAL[resource], _DENIED[resource])


async def handle_describe_configs(context: Context, request: Request) -> Reply:
    registry = context.topics
    body = request.body
    # Absent from the older versions: False there.
    synonyms = bool(getattr(body, "include_synonyms", False))
    documentation = bool(getattr(body, "include_documentation", False))
    broker_settings = context.config.model_dump(by_alias=True)
    results = []
    for resource in body.resources:
        kind, name = int(resource.resource_type), resource.resource_name
        keys = resource.configuration_keys
        wanted = set(keys) if keys else None  # None or empty: every config
        denial = _config_denied(context, request, AclOperation.DESCRIBE_CONFIGS, kind, name)
        if denial is not None:
            result = DescribeConfigsResult(
                resource.resource_type, name, error_code=denial.code, error_message=str(denial)
            )
        elif kind == TOPIC_RESOURCE:
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
                    _topic_entry(
                        config,
                        topic,
                        registry.topic_config(topic, key),
                        broker_settings if synonyms else None,
                        documentation,
                    )
                    for key, config in TOPIC_CONFIGS.items()
                    if wanted is None or key in wanted
                ]
                result = DescribeConfigsResult(resource.resource_type, name, configs)
        elif kind == BROKER_RESOURCE:
            configs = [
                DescribedConfig(key, str(value), CONFIG_SOURCE_DEFAULT, read_only=True)
                for key, value in sorted(broker_settings.items())
                if wanted is None or key in wanted
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


def _topic_entry(
    config: TopicConfig,
    topic: Topic,
    value: str,
    broker_settings: dict[str, Any] | None,
    documentation: bool,
) -> DescribedConfig:
    explicit = config.name in topic.configs
    synonyms = []
    if broker_settings is not None:
        if explicit:
            synonyms.append(DescribedSynonym(config.name, value, CONFIG_SOURCE_DYNAMIC_TOPIC))
        setting = broker_settings.get(config.synonym) if config.synonym else None
        if config.synonym is not None and setting is not None:
            shown = str(setting).lower() if isinstance(setting, bool) else str(setting)
            synonyms.append(DescribedSynonym(config.synonym, shown, CONFIG_SOURCE_DEFAULT))
    return DescribedConfig(
        config.name,
        value,
        CONFIG_SOURCE_DYNAMIC_TOPIC if explicit else CONFIG_SOURCE_DEFAULT,
        synonyms=synonyms,
        config_type=int(config.type),
        documentation=_documentation(config) if documentation else None,
    )


def _documentation(config: TopicConfig) -> str:
    if config.effect is None:
        return f"{config.documentation} Accepted without effect on this broker."
    return f"{config.documentation} On this broker: {config.effect}."


async def handle_incremental_alter_configs(context: Context, request: Request) -> Reply:
    body = request.body

    async def alter(resource: Any) -> None:
        changes = [
            ConfigChange(change.name, int(change.config_operation), change.value)
            for change in resource.configs
        ]
        await context.topics.alter_configs(
            resource.resource_name, changes, validate_only=bool(body.validate_only)
        )

    responses = await _alter_each(context, request, "IncrementalAlterConfigs", alter)
    return respond(request, IncrementalAlterConfigsResponse(responses))


async def handle_alter_configs(context: Context, request: Request) -> Reply:
    body = request.body

    async def replace(resource: Any) -> None:
        configs = [(config.name, config.value) for config in resource.configs]
        await context.topics.replace_configs(
            resource.resource_name, configs, validate_only=bool(body.validate_only)
        )

    responses = await _alter_each(context, request, "AlterConfigs", replace)
    return respond(request, AlterConfigsResponse(responses))


async def _alter_each(
    context: Context, request: Request, api: str, alter: Callable[[Any], Awaitable[None]]
) -> list[AlterConfigsResourceResponse]:
    """Each resource altered on its own; one resource's error does not fail the others. Only
    topics can be changed: any other resource type is refused with what to do instead."""
    resources = request.body.resources
    named = Counter((int(r.resource_type), r.resource_name) for r in resources)
    responses = []
    for resource in resources:
        kind, name = int(resource.resource_type), resource.resource_name
        try:
            if named[(kind, name)] > 1:
                raise TopicError(
                    KafkaErrorCode.INVALID_REQUEST, "Each resource must appear at most once."
                )
            denial = _config_denied(context, request, AclOperation.ALTER_CONFIGS, kind, name)
            if denial is not None:
                raise denial
            refusal = config_resource_refusal(context, request, api, kind)
            if refusal is not None:
                raise TopicError(KafkaErrorCode.INVALID_REQUEST, refusal)
            await alter(resource)
        except TopicError as error:
            responses.append(
                AlterConfigsResourceResponse(
                    resource.resource_type, name, error_code=error.code, error_message=str(error)
                )
            )
            continue
        responses.append(AlterConfigsResourceResponse(resource.resource_type, name))
    return responses
