"""Membership changes: one voter at a time, effective on append.

Choice
------
laminar uses single-server changes (Ongaro's thesis, section 4), not joint consensus. A change
is one of: add a learner, promote a learner to voter, add a voter directly, remove a replica.
Each CONFIG entry carries the *complete* resulting configuration (not a delta), so applying it
is idempotent and the configuration "as of offset i" is simply the latest CONFIG entry at or
below i (or the persisted base configuration when there is none above the base's offset).

A replica uses the latest configuration in its log, committed or not, from the moment the entry
is appended (leader: on propose; follower: on receiving it). If the entry is truncated away,
the replica falls back to the previous one. The leader counts commit quorums and votes with
that configuration.

Safety argument
---------------
1. Any two configurations that differ by at most one voter have overlapping majorities: with
   voter sets C and C' = C + {x} (or C - {x}), a majority of C and a majority of C' always share
   a member. (|C| = n: majorities have >= n//2+1 members of C, and of C' at least
   (n+1)//2+1, of which at least (n+1)//2 are in C; n//2+1 + (n+1)//2 > n.) Learners never
   count, so adding, removing or promoting a learner changes voters by at most one.
2. The leader appends a new CONFIG entry only when (a) every CONFIG entry in its log is
   committed and (b) it has committed an entry of its own term (the election no-op). (a) means
   at most two configurations are "live" at any time: the committed one and the one just
   appended, and they differ by one voter. (b) closes the known hole in the original
   single-server algorithm: without it, a leader of a new term could append change D2 while
   an uncommitted change D1 of an older leader still sits on some logs, letting two leaders
   with configurations differing by two voters be elected in one term. Once the leader has
   committed in its term, any later leader holds the leader's whole committed log (leader
   completeness), hence the same configuration lineage, so configurations seen by competing
   candidates can only be C_committed or C_committed + one change.
3. Because every candidate decides with the latest configuration in its log and (by 2) every
   log's latest configuration is one of two adjacent configurations, any two majorities that
   elect leaders or commit entries in the same term intersect (by 1); elections stay unique per
   term and committed entries survive, exactly as in fixed-membership Raft.
4. A leader may not remove itself (transfer leadership first), which avoids a leader managing
   a configuration it is not part of. A removed replica that missed its removal can only
   disrupt through elections; pre-vote plus the check-quorum lease make live replicas ignore it,
   and it cannot win because its log lacks the committed removal entry.
5. Reset (the log's snapshot install) hands the follower the leader's committed configuration
   together with the offset it holds at; CONFIG entries at or below that offset are older and
   are ignored, and a replica whose log ends below that offset refuses to campaign (its log
   misses committed entries, so it could not win anyway).
"""

from __future__ import annotations

from laminar.raft.types import ConfChange, ConfChangeRejected, ConfChangeType, ConfState


def encode_conf(conf: ConfState) -> bytes:
    """Deterministic text encoding of the full configuration stored in a CONFIG entry."""
    voters = ",".join(str(v) for v in conf.voters)
    learners = ",".join(str(v) for v in conf.learners)
    return f"v={voters};l={learners}".encode("ascii")


def _ids(text: str) -> tuple[int, ...]:
    if not text:
        return ()
    ids = tuple(sorted({int(x) for x in text.split(",")}))
    if any(i <= 0 for i in ids):
        raise ValueError("node ids must be > 0")
    return ids


def decode_conf(data: bytes | memoryview, index: int = -1) -> ConfState | None:
    """Inverse of ``encode_conf``; None for malformed data (a peer can't crash us)."""
    try:
        text = bytes(data).decode("ascii")
        v_part, l_part = text.split(";")
        if not v_part.startswith("v=") or not l_part.startswith("l="):
            return None
        voters = _ids(v_part[2:])
        learners = _ids(l_part[2:])
    except (ValueError, UnicodeDecodeError):
        return None
    if set(voters) & set(learners):
        return None
    return ConfState(voters, learners, index)


def apply_change(conf: ConfState, change: ConfChange, leader_id: int) -> ConfState:
    """The configuration after ``change``; raises ConfChangeRejected when not allowed."""
    nid = change.node_id
    if nid <= 0:
        raise ConfChangeRejected(f"invalid node id {nid}")
    voters = set(conf.voters)
    learners = set(conf.learners)
    t = change.type
    if t == ConfChangeType.ADD_LEARNER:
        if nid in voters or nid in learners:
            raise ConfChangeRejected(f"node {nid} is already a member")
        learners.add(nid)
    elif t == ConfChangeType.PROMOTE:
        if nid not in learners:
            raise ConfChangeRejected(f"node {nid} is not a learner")
        learners.discard(nid)
        voters.add(nid)
    elif t == ConfChangeType.ADD_VOTER:
        if nid in voters:
            raise ConfChangeRejected(f"node {nid} is already a voter")
        learners.discard(nid)
        voters.add(nid)
    elif t == ConfChangeType.REMOVE:
        if nid == leader_id:
            raise ConfChangeRejected("the leader cannot remove itself; transfer leadership first")
        if nid not in voters and nid not in learners:
            raise ConfChangeRejected(f"node {nid} is not a member")
        voters.discard(nid)
        learners.discard(nid)
        if not voters:
            raise ConfChangeRejected("cannot remove the last voter")
    else:
        raise ConfChangeRejected(f"unknown change type {t}")
    return ConfState(tuple(sorted(voters)), tuple(sorted(learners)))
