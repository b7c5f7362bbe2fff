"""Plain values exchanged between the Raft core and its driver.

Everything here is small and flat on purpose: the node encodes messages to Cap'n Proto field by
field, and the hot path allocates nothing per entry beyond the ``Entry`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from laminar.errors import InvalidRequestError, NotLeaderError, RequestTimeoutError

MIB = 1024 * 1024


class EntryKind(IntEnum):
    NORMAL = 0
    NOOP = 1
    CONFIG = 2


@dataclass(slots=True)
class Entry:
    """One record batch occupying offsets [index, last] of the partition log."""

    term: int
    index: int
    last: int
    kind: EntryKind
    data: bytes | memoryview


@dataclass(slots=True)
class HardState:
    """What must be durable before votes or acks leave the node (commit is advisory)."""

    term: int = 0
    vote: int = 0
    commit: int = -1


@dataclass(slots=True)
class ConfState:
    """A configuration; ``index`` is the offset as of which it is known to hold (-1: bootstrap).

    The core persists the configuration of the *committed* prefix through ``Ready.conf_state``;
    on restart it rescans only the log above ``max(index, hard_state.commit)`` for CONFIG entries.
    """

    voters: tuple[int, ...]
    learners: tuple[int, ...] = ()
    index: int = -1

    def same_members(self, other: ConfState) -> bool:
        return self.voters == other.voters and self.learners == other.learners


class MessageType(IntEnum):
    APPEND = 0
    APPEND_RESP = 1
    VOTE = 2
    VOTE_RESP = 3
    PRE_VOTE = 4
    PRE_VOTE_RESP = 5
    HEARTBEAT = 6
    HEARTBEAT_RESP = 7
    TIMEOUT_NOW = 8
    RESET = 9


@dataclass(slots=True)
class Message:
    """A peer message; field meaning per type is documented in ``laminar.raft.core``.

    ``after_persist`` means: send only once everything this node handed out in this and earlier
    Readys is durable. ``quiesce`` on a HEARTBEAT tells the follower to stop ticking.
    """

    type: MessageType
    to: int
    frm: int
    term: int
    log_term: int = 0
    index: int = -1
    entries: list[Entry] = field(default_factory=list)
    commit: int = -1
    reject: bool = False
    reject_hint: int = -1
    context: bytes = b""
    after_persist: bool = False
    quiesce: bool = False


@dataclass(slots=True)
class Ready:
    """One batch of work for the driver: persist, apply to storage, send, apply to the app.

    Order for the driver: if ``reset``: reset the log; if ``entries``: truncate from
    ``entries[0].index`` when it is <= the storage's last index, then append; make entries and
    then ``hard_state``/``conf_state`` (together) durable; send ``messages`` (the ones with
    ``after_persist`` only after that durability); apply ``committed_entries``; call
    ``advance``. Report durability with ``RaftNode.persisted``. After a ``reset`` the committed
    entries below the new start are never delivered: an application that consumes
    ``committed_entries`` must restore its state from elsewhere.

    A ``reset`` removes the CONFIG entries the replica's configuration came from, so the
    ``conf_state`` (and ``hard_state``) of the same Ready must be durable no later than the
    reset itself (etcd saves a snapshot, whose metadata carries the ConfState, before applying
    it). Otherwise a crash in between leaves a reset log beside an older configuration, and
    the restarted replica counts votes and commits with voters that are no longer the group's.
    """

    hard_state: HardState | None
    conf_state: ConfState | None
    entries: list[Entry]
    reset: tuple[int, int] | None
    messages: list[Message]
    committed_entries: list[Entry]
    read_states: list[tuple[bytes, int]]


class SendGate(Protocol):
    """The driver's say on sending entries (``RaftConfig.send_gate``): a node catching up a
    peer on thousands of groups at once must not queue gigabytes toward it."""

    def open(self, to: int) -> bool:
        """Whether entries may go to ``to`` now; if not, the driver calls ``resume_sends(to)``
        once they may."""
        ...

    def sent(self, to: int, size: int) -> None:
        """Entries of ``size`` bytes were sent to ``to``."""
        ...


@dataclass(slots=True)
class RaftConfig:
    election_tick: int = 10
    heartbeat_tick: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    check_quorum_tick: int = 0
    """Ticks a leader may go without hearing from a majority before it steps down; 0: one
    election timeout. Longer keeps leaders through a slow (CPU-starved) follower; a dead
    one is noticed by the node's liveness checks, not by this."""
    max_inflight_msgs: int = 256
    max_inflight_bytes: int = 32 * MIB
    max_msg_bytes: int = 1 * MIB
    max_uncommitted_bytes: int | None = None
    seed: int | None = None
    deliver_committed: bool = True
    prompt_commit: bool = False
    """Tell followers a new commit at once (the quiescing round, or empty appends while the
    group cannot quiesce). By default they learn it from the next append or the next tick's
    heartbeat round, so writes back to back take no commit round each. For a group every
    node answers reads of."""
    # Last offset the application already applied (restart): delivery resumes after it.
    applied: int = -1
    send_gate: SendGate | None = None
    """None: entries go whenever Raft's own flow control lets them."""


class Role(IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


class ConfChangeType(IntEnum):
    ADD_LEARNER = 0
    PROMOTE = 1
    REMOVE = 2
    ADD_VOTER = 3


@dataclass(slots=True, frozen=True)
class ConfChange:
    type: ConfChangeType
    node_id: int


class ProgressState(IntEnum):
    PROBE = 0
    REPLICATE = 1
    RESET = 2


@dataclass(slots=True)
class PeerStatus:
    match: int
    next: int
    state: ProgressState
    recent_active: bool
    learner: bool


@dataclass(slots=True)
class Status:
    id: int
    role: Role
    term: int
    vote: int
    leader_id: int
    commit: int
    applied: int
    last_index: int
    conf: ConfState
    quiesced: bool
    is_learner: bool
    transferee: int
    progress: dict[int, PeerStatus]


class NotLeader(NotLeaderError):
    """Proposal or request on a replica that is not (or is ceasing to be) the leader."""


class ConfChangeRejected(InvalidRequestError):
    """A membership change that would be unsafe or is malformed right now."""


class ProposalDropped(RequestTimeoutError):
    """The leader's uncommitted backlog is over ``max_uncommitted_bytes``; retry later."""
