"""The Kafka API handlers, one module per API family; :mod:`automq_ref.kafka.dispatch` routes
requests to them. Each handler is ``async def handle_...(context, request) -> Reply`` (see
:mod:`automq_ref.kafka.request`) and answers with a typed response
(:mod:`automq_ref.kafka.responses`), except Produce and Fetch, whose encoders are hand-written."""
