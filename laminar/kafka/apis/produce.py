"""Produce (key 0): Kafka v2 batches in, converted header-only, appended through Raft.

acks 0 / 1 / -1 are laminar's none / leader / all; acks=0 gets no response at all.
"""

from __future__ import annotations

from typing import Any

from laminar.auth.acl import PRODUCE
from laminar.errors import LaminarError
from laminar.kafka import errors, records
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT16, INT32, INT64, RECORDS, STRING, Array, F, Struct
from laminar.kafka.errors import KafkaError
from laminar.node.partition_io import ACKS_ALL, ACKS_LEADER, ACKS_NONE
from laminar.node.replica import Replica, Waiter

REQUEST = Struct(
    [
        F("transactional_id", STRING, "3+", nullable="3+"),
        F("acks", INT16),
        F("timeout_ms", INT32),
        F(
            "topic_data",
            Array(
                Struct(
                    [
                        F("name", STRING),
                        F(
                            "partition_data",
                            Array(
                                Struct([F("index", INT32), F("records", RECORDS, nullable="0+")])
                            ),
                        ),
                    ]
                )
            ),
        ),
    ]
)
PARTITION_RESPONSE = Struct(
    [
        F("index", INT32),
        F("error_code", INT16),
        F("base_offset", INT64, default=-1),
        F("log_append_time_ms", INT64, "2+", default=-1),
        F("log_start_offset", INT64, "5+", default=-1),
        F(
            "record_errors",
            Array(
                Struct(
                    [
                        F("batch_index", INT32),
                        F("batch_index_error_message", STRING, nullable="0+"),
                    ]
                )
            ),
            "8+",
        ),
        F("error_message", STRING, "8+", nullable="0+"),
    ]
)
RESPONSE = Struct(
    [
        F(
            "responses",
            Array(Struct([F("name", STRING), F("partition_responses", Array(PARTITION_RESPONSE))])),
        ),
        F("throttle_time_ms", INT32, "1+"),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any] | None:
    broker = ctx.broker
    io = broker.io
    acks = request["acks"]
    responses = []
    waits: list[tuple[dict[str, Any], Waiter]] = []
    touched: set[Replica] = set()
    timeout_ms = request["timeout_ms"] or 30_000
    batches = sum(len(topic["partition_data"]) for topic in request["topic_data"])
    async with io.admitted(batches, acks, timeout_ms) as proposed:
        for topic in request["topic_data"]:
            name = topic["name"]
            out_partitions = []
            for part in topic["partition_data"]:
                result: dict[str, Any] = {"index": part["index"], "error_code": 0}
                out_partitions.append(result)
                try:
                    if acks not in (ACKS_ALL, ACKS_LEADER, ACKS_NONE):
                        raise KafkaError(errors.INVALID_REQUIRED_ACKS, f"acks={acks}")
                    if broker.is_internal(name):
                        raise KafkaError(errors.INVALID_TOPIC_EXCEPTION, f"{name} is internal")
                    ctx.authorize(PRODUCE, name)
                    replica = io.leader_replica(name, part["index"])
                    data = part["records"]
                    if data is None or not len(data):
                        raise KafkaError(errors.CORRUPT_MESSAGE, "no record batch")
                    broker.refuse_when_full(len(data))
                    base = last = -1
                    for kbatch in records.iter_kafka_batches(data):
                        batch = records.to_laminar(kbatch)
                        header = io.verify(batch)
                        # io.append applies the idempotent sequence rule (laminar.node.sequences)
                        first, end = io.append(replica, batch, header)
                        base = first if base < 0 else base
                        last = end
                    touched.add(replica)
                    result["base_offset"] = base
                    result["log_start_offset"] = replica.log.start_offset
                    waiter = io.commit_waiter(replica, last)
                    if waiter is not None:
                        proposed.append(waiter.future)
                        if acks == ACKS_ALL:
                            waits.append((result, waiter))
                except LaminarError as exc:
                    result["error_code"] = errors.code_of(exc)
                    result["error_message"] = str(exc)
                    result["base_offset"] = -1
            responses.append({"name": name, "partition_responses": out_partitions})
        io.appended(touched, acks)
    if acks == ACKS_NONE:
        return None
    if waits:
        outcomes = await io.await_commits([w for _, w in waits], timeout_ms)
        for (result, _), error in zip(waits, outcomes, strict=True):
            if error is not None:
                result["error_code"] = errors.code_of(error)
                result["error_message"] = str(error)
    return {"responses": responses, "throttle_time_ms": 0}


API = Api(0, "Produce", 3, 9, REQUEST, RESPONSE, handle, flexible_from=9)
