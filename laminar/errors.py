"""Typed errors shared by the node, the client and the storage engine.

Every error a client or peer can cause has a stable numeric ``code`` so it can cross the wire
as a typed reply and be re-raised as the same class on the other side.
"""

from __future__ import annotations

from typing import ClassVar


class LaminarError(Exception):
    """Base of every laminar error; ``code`` identifies the class on the wire."""

    code: ClassVar[int] = 1


class CorruptBatchError(LaminarError):
    """A record batch failed its length or crc32c check, or is malformed."""

    code = 2


class DecompressionLimitError(CorruptBatchError):
    """A compressed batch would inflate beyond the reader's limit (a decompression bomb).

    A CorruptBatchError (and travels as one): no reader can use the batch."""


class BatchTooLargeError(LaminarError):
    """A record batch is larger than the configured maximum."""

    code = 3


class OffsetOutOfRangeError(LaminarError):
    """An offset is outside [start, end] of a partition log."""

    code = 4

    def __init__(self, offset: int, start: int, end: int) -> None:
        super().__init__(f"offset {offset} is out of range [{start}, {end}]")
        self.offset = offset
        self.start = start
        self.end = end


class UnknownTopicError(LaminarError):
    code = 5


class UnknownPartitionError(LaminarError):
    code = 6


class NotLeaderError(LaminarError):
    """This replica is not the leader; ``leader_id``/``leader_address`` name the known one."""

    code = 7

    def __init__(
        self, message: str = "not the leader", leader_id: int = 0, leader_address: str = ""
    ) -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_address = leader_address


class RequestTimeoutError(LaminarError):
    code = 8


class TopicExistsError(LaminarError):
    code = 9


class InvalidRequestError(LaminarError):
    """A request is well-framed but asks for something invalid (bad argument)."""

    code = 10


class UnsupportedCompressionError(InvalidRequestError, ValueError):
    """A compression codec or level that laminar does not write (a producer option)."""


class CorruptLogError(LaminarError):
    """Stored data failed verification where it cannot be repaired (a sealed segment)."""

    code = 11


class NotEnoughReplicasError(LaminarError):
    """Too few live nodes to place or acknowledge the requested replication factor."""

    code = 12


class ProtocolError(LaminarError):
    """A frame or message could not be decoded; the connection that sent it is closed."""

    code = 13


class DiskFullError(LaminarError):
    """The node's data directory is (nearly) out of space (``--min-free-bytes``): the write was
    not stored. Writes resume by themselves once space is freed."""

    code = 14


class PartitionSealedError(LaminarError):
    """The partition was sealed by a split or merge (key-range topics, ``laminar.splits``): it
    accepts no record any more. The message names the partitions that took its range over; a
    producer refreshes its metadata and sends the records there."""

    code = 15


class PartitionRetiredError(LaminarError):
    """The partition was retired (key-range topics, ``laminar.splits.retire``): retention
    removed all its records after its seal, so it has no replicas and nothing to read. Not
    retried: it never comes back (its number is never reused)."""

    code = 16


class OutOfOrderSequenceError(LaminarError):
    """An idempotent producer's batch does not follow the last one this partition stored for it
    (its base sequence is not the last sequence + 1, nor a batch already written): nothing was
    stored. Retriable: an earlier batch of the same partition failed or is being retried, and
    this one is resent after it (a producer with several batches in flight per partition)."""

    code = 17


class DuplicateSequenceError(LaminarError):
    """An idempotent producer resent a batch older than the ones this partition remembers for
    it: it was written before, but its offsets are no longer known. Nothing was stored."""

    code = 18


class InvalidProducerEpochError(LaminarError):
    """A batch carries an older producer epoch than one this partition already stored for the
    same producer id (a fenced, older incarnation): nothing was stored."""

    code = 19


# Authentication and authorization (laminar/auth): codes 50-59.


class AuthenticationError(LaminarError):
    """The connection is not authenticated (the cluster has users: authenticate first), or
    a SASL/SCRAM exchange failed (unknown user, wrong password, malformed message). Not
    retriable: the credentials must change."""

    code = 50


class AuthorizationError(LaminarError):
    """The authenticated user may not do this (no ACL allows it); nothing was changed."""

    code = 51


class NodeStartingError(LaminarError):
    """This node answers clients but has not joined the cluster yet (it is still opening its
    replicas, or has not heard from the metadata leader): it cannot judge the cluster's
    health. Another node can; ``Admin`` asks one."""

    code = 52


# Consumer groups (laminar/groups): codes 20-29.


class UnknownMemberIdError(LaminarError):
    """The member id is not (or no longer) in the group: drop all partitions, join again."""

    code = 20


class FencedMemberEpochError(LaminarError):
    """The member was fenced (epoch ahead/behind or rebalance timeout): drop all, join again."""

    code = 21


class StaleMemberEpochError(LaminarError):
    """An offset commit carries an epoch older than the member's last two: retry with the new."""

    code = 22


class GroupNotEmptyError(LaminarError):
    """Only a group without members accepts commits from outside it or can be deleted."""

    code = 23


class NotCoordinatorError(LaminarError):
    """This coordinator lost its log (a failed append): rebuild it from the internal partition."""

    code = 24


class InvalidOffsetError(InvalidRequestError):
    """A committed offset must be >= 0 and its metadata a string of at most 4096 characters."""

    code = 25


class PartitionNotOwnedError(LaminarError):
    """A member commits only partitions it may own (assigned or being revoked): a commit that
    arrives after the partition moved on must not overwrite its new owner's progress."""

    code = 26


# Classic (JoinGroup/SyncGroup) consumer groups (laminar/groups/classic.py): codes 40-49.


class IllegalGenerationError(LaminarError):
    """A classic member named a generation the group is not at: it must join again."""

    code = 40


class RebalanceInProgressError(LaminarError):
    """A classic group is rebalancing: the member must send JoinGroup again."""

    code = 41


class FencedInstanceIdError(LaminarError):
    """A newer member took over this static member's instance id: this one is a zombie."""

    code = 42


class MemberIdRequiredError(LaminarError):
    """A new classic member must join again with the member id it was given (``member_id``)."""

    code = 43

    def __init__(self, message: str, member_id: str = "") -> None:
        super().__init__(message)
        self.member_id = member_id


class InconsistentGroupProtocolError(LaminarError):
    """The protocol type or protocols do not match the group's (or the group id is in use by a
    group of the other kind)."""

    code = 44


class GroupIdNotFoundError(LaminarError):
    """The group does not exist, or is not of the kind the request expects."""

    code = 45


class InvalidSessionTimeoutError(InvalidRequestError):
    """A classic member's session timeout is outside the coordinator's bounds."""

    code = 46


# Share groups (laminar/queues): codes 30-39.


class ReceiptExpiredError(LaminarError):
    """A receipt is not its offset's current acquisition (the lock expired, another member or a
    newer delivery holds it, or it was already settled): the settlement did nothing; the
    message may be delivered again (to this member or another)."""

    code = 30


class InvalidConfigError(InvalidRequestError):
    """A share group setting is unknown or out of its range; nothing was changed."""

    code = 31


ERRORS_BY_CODE: dict[int, type[LaminarError]] = {
    cls.code: cls
    for cls in (
        LaminarError,
        CorruptBatchError,
        BatchTooLargeError,
        OffsetOutOfRangeError,
        UnknownTopicError,
        UnknownPartitionError,
        NotLeaderError,
        RequestTimeoutError,
        TopicExistsError,
        InvalidRequestError,
        CorruptLogError,
        NotEnoughReplicasError,
        ProtocolError,
        DiskFullError,
        NodeStartingError,
        PartitionSealedError,
        PartitionRetiredError,
        OutOfOrderSequenceError,
        DuplicateSequenceError,
        InvalidProducerEpochError,
        AuthenticationError,
        AuthorizationError,
        UnknownMemberIdError,
        FencedMemberEpochError,
        StaleMemberEpochError,
        GroupNotEmptyError,
        NotCoordinatorError,
        InvalidOffsetError,
        PartitionNotOwnedError,
        ReceiptExpiredError,
        IllegalGenerationError,
        RebalanceInProgressError,
        FencedInstanceIdError,
        MemberIdRequiredError,
        InconsistentGroupProtocolError,
        GroupIdNotFoundError,
        InvalidSessionTimeoutError,
        InvalidConfigError,
    )
}
