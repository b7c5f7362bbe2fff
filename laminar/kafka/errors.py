"""Kafka error codes, and laminar's typed errors mapped onto them."""

from __future__ import annotations

from laminar.errors import (
    AuthenticationError,
    AuthorizationError,
    BatchTooLargeError,
    CorruptBatchError,
    CorruptLogError,
    DiskFullError,
    DuplicateSequenceError,
    InvalidConfigError,
    InvalidProducerEpochError,
    InvalidRequestError,
    LaminarError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PartitionRetiredError,
    PartitionSealedError,
    RequestTimeoutError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
    UnsupportedCompressionError,
)

NONE = 0
UNKNOWN_SERVER_ERROR = -1
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
NOT_COORDINATOR = 16
INVALID_TOPIC_EXCEPTION = 17
NOT_ENOUGH_REPLICAS = 19
INVALID_REQUIRED_ACKS = 21
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
UNKNOWN_PRODUCER_ID = 59
KAFKA_STORAGE_ERROR = 56
SASL_AUTHENTICATION_FAILED = 58
FETCH_SESSION_ID_NOT_FOUND = 70
UNSUPPORTED_COMPRESSION_TYPE = 76
RESOURCE_NOT_FOUND = 91
DUPLICATE_RESOURCE = 92
UNACCEPTABLE_CREDENTIAL = 93

_BY_CLASS: list[tuple[type[LaminarError], int]] = [
    (AuthorizationError, TOPIC_AUTHORIZATION_FAILED),
    (AuthenticationError, SASL_AUTHENTICATION_FAILED),
    (NotLeaderError, NOT_LEADER_OR_FOLLOWER),
    # A Kafka client cannot follow lineage: it refreshes its metadata and retries, and its
    # partitioner (a hash over the partition count) keeps the batch on the sealed partition,
    # so the write fails at the client's delivery timeout: never stored after the seal.
    (PartitionSealedError, NOT_LEADER_OR_FOLLOWER),
    (UnknownTopicError, UNKNOWN_TOPIC_OR_PARTITION),
    (UnknownPartitionError, UNKNOWN_TOPIC_OR_PARTITION),
    (PartitionRetiredError, UNKNOWN_TOPIC_OR_PARTITION),
    (OffsetOutOfRangeError, OFFSET_OUT_OF_RANGE),
    (BatchTooLargeError, MESSAGE_TOO_LARGE),
    (CorruptBatchError, CORRUPT_MESSAGE),
    (CorruptLogError, NOT_LEADER_OR_FOLLOWER),
    (RequestTimeoutError, REQUEST_TIMED_OUT),
    (DiskFullError, KAFKA_STORAGE_ERROR),
    (TopicExistsError, TOPIC_ALREADY_EXISTS),
    (NotEnoughReplicasError, NOT_ENOUGH_REPLICAS),
    (UnsupportedCompressionError, UNSUPPORTED_COMPRESSION_TYPE),
    (InvalidConfigError, INVALID_CONFIG),
    (InvalidRequestError, INVALID_REQUEST),
    (OutOfOrderSequenceError, OUT_OF_ORDER_SEQUENCE_NUMBER),
    (DuplicateSequenceError, DUPLICATE_SEQUENCE_NUMBER),
    (InvalidProducerEpochError, INVALID_PRODUCER_EPOCH),
]


def code_of(error: BaseException | None) -> int:
    """The Kafka error code for a laminar error (UNKNOWN_SERVER_ERROR for anything else)."""
    if error is None:
        return NONE
    if isinstance(error, KafkaError):
        return error.kafka_code
    for cls, code in _BY_CLASS:
        if isinstance(error, cls):
            return code
    return UNKNOWN_SERVER_ERROR


class KafkaError(LaminarError):
    """An error that exists only in Kafka's vocabulary (e.g. OUT_OF_ORDER_SEQUENCE_NUMBER)."""

    def __init__(self, kafka_code: int, message: str = "") -> None:
        super().__init__(message or f"kafka error {kafka_code}")
        self.kafka_code = kafka_code
