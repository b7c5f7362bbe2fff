"""The node's side of replicas that lost their state (the rules are in ``amnesia.py``).

It asks peers whether a node with an empty data directory is new, reports lost replicas to
the metadata, lifts a replica's gate when the metadata records its re-admission, and saves
the durable watermarks that reveal a log cut short by corruption.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from laminar.errors import LaminarError

if TYPE_CHECKING:
    from laminar.node.node import Node
    from laminar.node.replica import Replica

log = structlog.get_logger(__name__)

WATERMARK_SAVE_SECONDS = 1.0


class Readmission:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.amnesia = node.amnesia
        self.metadata_start = -1
        """Last offset of the metadata log as opened (see ``serve_knows``)."""

    def opened(self, replica: Replica, lost: bool) -> bool:
        """A replica was opened (``lost``: its directory was missing); host it, and if it
        lost state, have it re-admitted. Returns whether it lost state."""
        lost = self.amnesia.check_log(replica.group, replica.log.end_offset) or lost
        self.node.runtime.add(replica)
        if lost:
            self.node.spawn(self._report_lost(replica))
        return lost

    async def _report_lost(self, replica: Replica) -> None:
        """Tell the metadata this replica lost its state; its group's leader re-admits it."""
        incident = self.amnesia.incident(replica.group)
        command = {
            "op": "replica_lost",
            "group": replica.group,
            "node": self.node.node_id,
            "incident": incident,
            "request_id": f"lost-{incident}",  # reported once per loss, however often sent
        }
        while not replica.closed and self.amnesia.incident(replica.group) == incident:
            try:
                await self.node.metadata_service.propose(command)
                return
            except (LaminarError, ConnectionError) as exc:
                log.debug("replica loss not yet recorded", error=str(exc))
                await asyncio.sleep(0.2)

    def applied(self, command: dict[str, Any]) -> None:
        """A committed metadata command was applied on this node."""
        op, node = command.get("op"), self.node
        if op == "register_node" and command.get("incarnation") == self.amnesia.incarnation:
            self.amnesia.registered()
        elif op == "replica_recovered" and command["node"] == node.node_id:
            replica = node.runtime.replicas.get(command["group"])
            if replica is not None:
                self.amnesia.recovered(replica.group, command["incident"], replica.raft.term)

    async def ask_peers_if_known(self) -> bool:
        """A node with an empty data directory: new, or did it lose everything?

        It lost its state if any peer knows it (it registered before: nodes register on their
        first start). It is new once a majority of the initial cluster (or, when joining, one
        running node) says, having applied its metadata log, that it does not know it.
        """
        node = self.node
        config = node.config
        if config.peers:
            needed = len({*config.peers, node.node_id}) // 2
        else:
            needed = 1 if config.join else 0
        unknown_to: set[int] = set()
        if needed:
            log.info("empty data directory: asking peers whether this node is new", needed=needed)
        while len(unknown_to) < needed:
            for peer in node.peers.connected_peers():
                if peer in unknown_to:
                    continue
                try:
                    answer = await node.calls.call(peer, "knows", {"node": node.node_id}, 1.0)
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
        node = self.node
        settled = node.metadata is None or node.metadata_service.applied >= self.metadata_start
        return {"known": int(body["node"]) in node.state.nodes, "settled": settled}

    async def watermark_loop(self) -> None:
        while True:
            await asyncio.sleep(WATERMARK_SAVE_SECONDS)
            for replica in list(self.node.runtime.replicas.values()):
                if not replica.closed:
                    self.amnesia.note_durable(replica.group, replica.log.durable_offset)
            snapshot = self.amnesia.watermarks_to_save()
            if snapshot is not None:
                await asyncio.to_thread(self.amnesia.save_watermarks, snapshot)
