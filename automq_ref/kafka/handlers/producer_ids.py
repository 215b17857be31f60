"""InitProducerId: a producer id for an idempotent producer.

A producer that sends its current id and epoch gets the next epoch of the same id; one that
sends none (or whose epoch is exhausted) gets a fresh id from the node's allocator
(:mod:`automq_ref.kafka.producer_ids`). One with a transactional id goes to the transaction
coordinator (:func:`automq_ref.kafka.handlers.transactions.handle_transactional_init`).
"""

from __future__ import annotations

from automq_ref.kafka.handlers.transactions import handle_transactional_init
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.responses import InitProducerIdResponse, respond
from automq_ref.kafka.server import Reply

MAX_PRODUCER_EPOCH = 32767


async def handle_init_producer_id(context: Context, request: Request) -> Reply:
    body = request.body
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
