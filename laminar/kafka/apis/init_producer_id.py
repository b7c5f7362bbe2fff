"""InitProducerId (key 22): a producer id and epoch for an idempotent producer.

Ids are drawn at random (as laminar's own producers do), so any node answers without a
coordinator; sequences are then checked per partition (``laminar/node/sequences.py``, the
rule the native protocol uses too).
Transactions are not supported: a transactional id is refused.
"""

from __future__ import annotations

from typing import Any

from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT16, INT32, INT64, STRING, F, Struct

MAX_EPOCH = 32_767

REQUEST = Struct(
    [
        F("transactional_id", STRING, nullable="0+"),
        F("transaction_timeout_ms", INT32),
        F("producer_id", INT64, "3+", default=-1),
        F("producer_epoch", INT16, "3+", default=-1),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32),
        F("error_code", INT16),
        F("producer_id", INT64, default=-1),
        F("producer_epoch", INT16, default=-1),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    if request["transactional_id"] is not None:
        return {"error_code": errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    producer_id, epoch = request["producer_id"], request["producer_epoch"]
    if producer_id >= 0 and 0 <= epoch < MAX_EPOCH:  # a producer bumping its epoch (KIP-360)
        return {"error_code": 0, "producer_id": producer_id, "producer_epoch": epoch + 1}
    return {"error_code": 0, "producer_id": ctx.broker.new_producer_id(), "producer_epoch": 0}


API = Api(22, "InitProducerId", 0, 4, REQUEST, RESPONSE, handle, flexible_from=2)
