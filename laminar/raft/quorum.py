"""Majority arithmetic over a voter set, kept apart from the protocol so it is easy to check."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import IntEnum


class VoteResult(IntEnum):
    PENDING = 0
    WON = 1
    LOST = 2


def majority(n: int) -> int:
    return n // 2 + 1


def committed_index(voters: Iterable[int], match: Mapping[int, int]) -> int:
    """Highest offset acknowledged by a majority of ``voters`` (-1 if none; voters missing
    from ``match`` count as having nothing)."""
    acked = sorted((match.get(v, -1) for v in voters), reverse=True)
    if not acked:
        return -1
    return acked[majority(len(acked)) - 1]


def vote_result(voters: Iterable[int], votes: Mapping[int, bool]) -> VoteResult:
    granted = rejected = total = 0
    for v in voters:
        total += 1
        r = votes.get(v)
        if r is True:
            granted += 1
        elif r is False:
            rejected += 1
    need = majority(total)
    if granted >= need:
        return VoteResult.WON
    if total - rejected < need:
        return VoteResult.LOST
    return VoteResult.PENDING


def has_quorum(voters: Iterable[int], acked: set[int] | Mapping[int, object]) -> bool:
    vs = list(voters)
    return sum(1 for v in vs if v in acked) >= majority(len(vs))
