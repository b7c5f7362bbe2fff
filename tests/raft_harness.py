"""A tiny synchronous driver for Raft unit tests: instant durability, explicit message control."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from laminar.raft import (
    ConfState,
    Entry,
    EntryKind,
    HardState,
    MemoryStorage,
    Message,
    RaftConfig,
    RaftNode,
)


def log_of(terms: Iterable[int], start: int = 0) -> MemoryStorage:
    """Storage holding one single-offset entry per term given, from offset ``start``."""
    st = MemoryStorage(start)
    ents = [
        Entry(t, start + i, start + i, EntryKind.NORMAL, b"x%d" % i) for i, t in enumerate(terms)
    ]
    st.append(ents)
    return st


class Net:
    """Nodes with in-memory storage; messages are queued and delivered on ``deliver``."""

    def __init__(
        self,
        ids: Iterable[int],
        *,
        storages: dict[int, MemoryStorage] | None = None,
        hard_states: dict[int, HardState] | None = None,
        voters: Iterable[int] | None = None,
        learners: Iterable[int] = (),
        **cfg: object,
    ) -> None:
        self.ids = list(ids)
        voters = tuple(voters) if voters is not None else tuple(self.ids)
        self.conf = ConfState(voters, tuple(learners))
        self.storages = storages or {}
        self.hard_states = hard_states or {}
        self.confs: dict[int, ConfState] = {}
        self.cfg = cfg
        self.nodes: dict[int, RaftNode] = {}
        self.queue: list[Message] = []
        self.sent: list[Message] = []
        self.cut: set[tuple[int, int]] = set()
        self.drop: Callable[[Message], bool] | None = None
        self.committed: dict[int, list[Entry]] = {}
        self.reads: dict[int, list[tuple[bytes, int]]] = {}
        self.durable = True
        for nid in self.ids:
            self.start(nid)

    def start(self, nid: int, conf: ConfState | None = None) -> RaftNode:
        st = self.storages.setdefault(nid, MemoryStorage())
        hs = self.hard_states.get(nid)
        conf = conf or self.confs.get(nid) or self.conf
        cfg = RaftConfig(seed=nid, **self.cfg)  # type: ignore[arg-type]
        node = RaftNode(nid, st, conf, hs, cfg)
        self.nodes[nid] = node
        self.committed.setdefault(nid, [])
        self.reads.setdefault(nid, [])
        if nid not in self.ids:
            self.ids.append(nid)
        return node

    def __getitem__(self, nid: int) -> RaftNode:
        return self.nodes[nid]

    def process(self, nid: int) -> None:
        node = self.nodes[nid]
        st = self.storages[nid]
        while node.has_ready():
            rd = node.ready()
            if rd.reset is not None:
                st.reset(*rd.reset)
            if rd.entries:
                st.append(rd.entries)
            if rd.hard_state is not None:
                self.hard_states[nid] = rd.hard_state
            if rd.conf_state is not None:
                self.confs[nid] = rd.conf_state
            self.queue.extend(rd.messages)
            self.sent.extend(rd.messages)
            self.committed[nid].extend(rd.committed_entries)
            self.reads[nid].extend(rd.read_states)
            node.advance(rd)
            if self.durable:
                last = st.last_index()
                node.persisted(last, st.term(last))

    def process_all(self) -> None:
        for nid in list(self.nodes):
            self.process(nid)

    def deliver(self, rounds: int = 200) -> None:
        """Deliver until quiet (bounded)."""
        for _ in range(rounds):
            self.process_all()
            if not self.queue:
                return
            q, self.queue = self.queue, []
            for m in q:
                if (m.frm, m.to) in self.cut or m.to not in self.nodes:
                    continue
                if self.drop is not None and self.drop(m):
                    continue
                self.nodes[m.to].step(m)
        raise AssertionError("network did not quiesce")

    def take(self) -> list[Message]:
        """Process all nodes and return (and remove) queued messages without delivering."""
        self.process_all()
        q, self.queue = self.queue, []
        return q

    def isolate(self, nid: int) -> None:
        for other in self.ids:
            if other != nid:
                self.cut.add((nid, other))
                self.cut.add((other, nid))

    def heal(self) -> None:
        self.cut.clear()

    def tick(self, nid: int, n: int = 1) -> None:
        for _ in range(n):
            self.nodes[nid].tick()
            self.process(nid)

    def tick_all(self, n: int = 1) -> None:
        for _ in range(n):
            for nid in list(self.nodes):
                self.nodes[nid].tick()
            self.deliver()

    def elect(self, nid: int) -> None:
        self.nodes[nid].campaign()
        self.deliver()

    def entries(self, nid: int) -> list[tuple[int, int, int]]:
        return [(e.index, e.last, e.term) for e in self.storages[nid].all_entries()]
