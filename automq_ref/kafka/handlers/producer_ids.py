"""InitProducerId: a producer id for an idempotent producer.

A producer that sends its current id and epoch gets the next epoch of the same id; one that
sends none (or whose epoch is exhausted) gets a fresh id from the node's allocator
(:mod:`automq_ref.kafka.producer_ids`). One with a transactional id goes to the transaction
coordinator (:func:`automq_ref.kafka.handlers.transactions.handle_transactional_init`).

With an authorizer, Kafka's rule (:func:`automq_ref.state_machines.acl.may_init_producer_id`):
a transactional producer needs WRITE on its transactional id (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED), an idempotent one IDEMPOTENT_WRITE on the cluster or
WRITE on some topic (else CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.handlers.authorize import may_init
from automq_ref.kafka.handlers.transactions import handle_transactional_init
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.responses import InitProducerIdResponse, respond
from automq_ref.kafka.server import Reply

MAX_PRODUCER_EPOCH = 32767


async def handle_init_producer_id(context: Context, request: Request) -> Reply:
    body = request.body
    if not may_init(context, request, body.transactional_id):
        error = (
            KafkaErrorCode.CLUSTER_AUTHORIZATION_FAILED
            if body.transactional_id is None
            else KafkaErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        )
        return respond(request, InitProducerIdResponse(error_code=error))
    if body.transactional_id is not None:
        return await handle_transactional_init(context, request)
    producer_id = int(getattr(body, "producer_id", -1))
    epoch = int(getattr(body, "producer_epoch", -1))
    if producer_id >= 0 and 0 <= epoch < MAX_PRODUCER_EPOCH:
        answer = InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch + 1)
    else:
        answer = InitProducerIdResponse(
            producer_id=await context.producer_ids.allocate(), producer_epoch=0
        )
    return respond(request, answer)
