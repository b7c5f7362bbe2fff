"""Typed errors of the group coordinator.

Codes 20-29 are reserved for groups; the node wiring registers these classes in
``laminar.errors.ERRORS_BY_CODE`` so they cross the wire. Unknown topics and partitions reuse
``UnknownTopicError`` and ``UnknownPartitionError``.
"""

from __future__ import annotations

from laminar.errors import InvalidRequestError, LaminarError


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


GROUP_ERRORS: tuple[type[LaminarError], ...] = (
    UnknownMemberIdError,
    FencedMemberEpochError,
    StaleMemberEpochError,
    GroupNotEmptyError,
    NotCoordinatorError,
    InvalidOffsetError,
    PartitionNotOwnedError,
)
