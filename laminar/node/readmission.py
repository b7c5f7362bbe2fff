"""The node's side of replicas that lost their state (the rules are in ``amnesia.py``).

``Readmission`` reports lost replicas to the metadata, lifts a replica's gate when the metadata
records its re-admission, and saves the durable watermarks that reveal a log cut short by
corruption. ``IdentityCheck`` asks peers whether a node with an empty data directory is new.
Both get the few node services they use, not the node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import structlog

from laminar.errors import LaminarError

if TYPE_CHECKING:
    from laminar.node.amnesia import Amnesia
    from laminar.node.calls import PeerCalls
    from laminar.node.config import NodeConfig
    from laminar.node.metadata import MetadataState
    from laminar.node.metadata_service import MetadataService
    from laminar.node.peers import PeerNetwork
    from laminar.node.replica import Replica
    from laminar.node.runtime import MultiRaft

log = structlog.get_logger(__name__)

WATERMARK_SAVE_SECONDS = 1.0

Propose = Callable[[dict[str, Any]], Awaitable[Any]]
"""Commits a metadata command (MetadataService.propose)."""
Spawn = Callable[[Coroutine[Any, Any, None]], object]


class Readmission:
    def __init__(
        self, node_id: int, amnesia: Amnesia, runtime: MultiRaft, propose: Propose, spawn: Spawn
    ) -> None:
        self.node_id = node_id
        self.amnesia = amnesia
        self.runtime = runtime
        self.propose = propose
        self.spawn = spawn

    def opened(self, replica: Replica, lost: bool) -> bool:
        """A replica was opened (``lost``: its directory was missing); host it, and if it
        lost state, have it re-admitted. Returns whether it lost state."""
        lost = self.amnesia.check_log(replica.group, replica.log.end_offset) or lost
        self.runtime.add(replica)
        if lost:
            self.spawn(self.report_lost(replica))
        return lost

    async def report_lost(self, replica: Replica) -> None:
        """Tell the metadata this replica lost its state; its group's leader re-admits it."""
        incident = self.amnesia.incident(replica.group)
        command = {
            "op": "replica_lost",
            "group": replica.group,
            "node": self.node_id,
            "incident": incident,
            "request_id": f"lost-{incident}",  # reported once per loss, however often sent
        }
        while not replica.closed and self.amnesia.incident(replica.group) == incident:
            try:
                await self.propose(command)
                return
            except (LaminarError, ConnectionError) as exc:
                log.debug("replica loss not yet recorded", error=str(exc))
                await asyncio.sleep(0.2)

    def applied(self, command: dict[str, Any]) -> None:
        """A committed metadata command was applied on this node."""
        op = command.get("op")
        if op == "register_node" and command.get("incarnation") == self.amnesia.incarnation:
            self.amnesia.registered()
        elif op == "replica_recovered" and command["node"] == self.node_id:
            replica = self.runtime.replicas.get(command["group"])
            if replica is not None:
                self.amnesia.recovered(replica.group, command["incident"], replica.raft.term)

    async def watermark_loop(self) -> None:
        """Note the durable offsets that passes moved, and save them about once a second.
        (Only passes move them up; what moves one down, a cut, lowers its watermark first:
        ``Amnesia.cutting``.)"""
        while True:
            await asyncio.sleep(WATERMARK_SAVE_SECONDS)
            moved, self.runtime.flushed = self.runtime.flushed, set()
            for replica in moved:
                if not replica.closed:
                    self.amnesia.note_durable(replica.group, replica.log.durable_offset)
            await asyncio.to_thread(self.amnesia.save_watermarks)


class IdentityCheck:
    """Whether a node with an empty data directory is new or lost everything, asked of and
    answered to peers (the peer call "knows")."""

    def __init__(
        self,
        config: NodeConfig,
        calls: PeerCalls,
        peers: PeerNetwork,
        state: MetadataState,
        metadata: MetadataService,
    ) -> None:
        self.config = config
        self.calls = calls
        self.peers = peers
        self.state = state
        self.metadata = metadata
        self.metadata_start = -1
        """Last offset of the metadata log as opened (see ``serve_knows``)."""

    async def ask_peers_if_known(self) -> bool:
        """A node with an empty data directory: new, or did it lose everything?

        It lost its state if any peer knows it (it registered before: nodes register on their
        first start). It is new once a majority of the initial cluster (or, when joining, one
        running node) says, having applied its metadata log, that it does not know it.
        """
        config = self.config
        if config.peers:
            needed = len({*config.peers, config.node_id}) // 2
        else:
            needed = 1 if config.join else 0
        unknown_to: set[int] = set()
        if needed:
            log.info("empty data directory: asking peers whether this node is new", needed=needed)
        while len(unknown_to) < needed:
            for peer in self.peers.connected_peers():
                if peer in unknown_to:
                    continue
                try:
                    answer = await self.calls.call(peer, "knows", {"node": config.node_id}, 1.0)
                except (LaminarError, ConnectionError):
                    continue
                if answer.get("known"):
                    log.warning("this node lost its data directory", known_by=peer)
                    return True
                if answer.get("settled"):
                    unknown_to.add(peer)
            await asyncio.sleep(0.1)
        return False

    async def serve_knows(self, _peer: int, body: Any) -> Any:
        """Whether a node registered before; ``settled`` once this node has applied the
        metadata log it started with (before, a registration may still be unapplied)."""
        settled = self.metadata.applied >= self.metadata_start  # -1 before the log opens
        return {"known": int(body["node"]) in self.state.nodes, "settled": settled}
