"""AlterConfigs (API key 33), the non-incremental config change that IncrementalAlterConfigs
replaced (KIP-339) and Kafka 4.0 still serves; librdkafka's ``alter_configs`` sends it.

Its meaning, kept here: the configs a resource lists become the topic's whole set. Each listed
config is set, and every config the topic had set that the request does not list goes back to
its default. The change is applied as the equivalent incremental one (SET and DELETE operations),
all or none, through the topic registry. Only topics can be changed, as for
IncrementalAlterConfigs (:mod:`automq_ref.kafka.handlers.unsupported`).
"""

from __future__ import annotations

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.handlers.unsupported import config_resource_refusal
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.responses import AlterConfigsResourceResponse, AlterConfigsResponse, respond
from automq_ref.kafka.server import Reply
from automq_ref.kafka.topic_registry import ConfigChange, ConfigOperation
from automq_ref.kafka.topics import TopicError


async def handle_alter_configs(context: Context, request: Request) -> Reply:
    body = request.body
    answers = []
    for resource in body.resources:
        kind, name = int(resource.resource_type), resource.resource_name
        try:
            refusal = config_resource_refusal(context, request, "AlterConfigs", kind)
            if refusal is not None:
                raise TopicError(KafkaErrorCode.INVALID_REQUEST, refusal)
            topic = context.topics.topics.get(name)
            listed = {config.name: config.value for config in resource.configs}
            changes = [ConfigChange(key, ConfigOperation.SET, v) for key, v in listed.items()]
            if topic is not None:
                changes += [
                    ConfigChange(key, ConfigOperation.DELETE, None)
                    for key in sorted(topic.configs)
                    if key not in listed
                ]
            await context.topics.alter_configs(
                name, changes, validate_only=bool(body.validate_only)
            )
        except TopicError as error:
            answers.append(
                AlterConfigsResourceResponse(
                    kind, name, error_code=error.code, error_message=str(error)
                )
            )
            continue
        answers.append(AlterConfigsResourceResponse(kind, name))
    return respond(request, AlterConfigsResponse(answers))
