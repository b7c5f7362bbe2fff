"""Replicas that lost their state: detect it, keep them from voting, mark them re-admitted.

Raft assumes a voter's log and vote survive restarts. A replica whose directory was wiped,
or whose log lost acknowledged batches, breaks that: with an empty log and no vote it would
grant votes to candidates lacking committed entries, and could vote twice in one term.

Every replica this node creates gets a marker, written durably before the replica takes part
in its group: a line in ``<data_dir>/replicas/created.log`` while it holds the default, a file
``<data_dir>/replicas/<name>.json`` once it holds more (a loss, a vote floor). Opening a
replica whose marker exists but whose directory is gone means the replica lost its state.
Such a replica is *gated* until its group re-admits it: it grants no vote, never campaigns
and ignores leader transfers; its acknowledgements stay truthful (it acks only what it holds
durably), so nothing else changes.
The group's leader removes it from the voters, adds it back as a learner, promotes it once it
holds the leader's whole log (``rebalance.advance_recovery``) and commits ``replica_recovered``
in the metadata; applying that lifts the gate. From then on the replica grants no vote in a
term at or below the one it had when re-admitted (its ``vote_floor``), the terms in which it
may have voted before the loss. See docs/ARCHITECTURE.md, "Replicas that lost state".
"""

from __future__ import annotations

import json
import os
import stat
import threading
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from laminar.errors import InvalidRequestError
from laminar.node.raft_codec import GroupMessage
from laminar.raft import Message, MessageType
from laminar.segment.fileio import fsync_dir, write_atomic, write_whole

log = structlog.get_logger(__name__)

MARKERS_DIR = "replicas"
IDENTITY_FILE = "identity.json"
WATERMARKS_FILE = "watermarks.json"
CREATED_FILE = "created.log"
"""The replicas created here whose marker is the default: ``+<name>`` lines, ``-<name>`` once
forgotten. One file appended and fdatasynced once per slice of new replicas: creating a file
per replica cost 0.6-0.8 ms of CPU each on this machine's ext4, seconds for a big topic."""
_ELECTION = frozenset({MessageType.VOTE, MessageType.PRE_VOTE, MessageType.TIMEOUT_NOW})
_CANDIDACY = frozenset({MessageType.VOTE, MessageType.PRE_VOTE})


@dataclass(slots=True)
class Marker:
    """What this node durably knows about one replica it created."""

    lost: bool = False
    """The replica lost its state and its group has not re-admitted it yet."""
    incident: str = ""
    """Names the loss, so a re-admission of an earlier loss does not lift a later one."""
    vote_floor: int = -1
    """No vote is granted in a term at or below this one."""


class Amnesia:
    """Markers and gates of the replicas on one node."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.directory = data_dir / MARKERS_DIR
        self._directory = str(self.directory)
        self.incarnation = ""
        """This data directory's identity, set by ``load_identity``."""
        self._identity: dict[str, str | int] = {}
        self.node_lost = False
        """The whole data directory was lost; until the new incarnation is registered."""
        self._watermarks: dict[str, int] = self._read_watermarks()
        self._saved_watermarks: dict[str, int] = dict(self._watermarks)
        self._watermarks_moved = False
        """Set by every change of ``_watermarks``: an idle node's save, once a second, compares
        nothing (a copy and a comparison of 10,000 entries were a twentieth of its CPU)."""
        self._save_lock = threading.Lock()
        self.markers: dict[int, tuple[str, Marker]] = {}
        """group -> (replica name, marker) of every open replica."""
        self.gated: set[int] = set()
        """Groups whose replica lost state and is not yet re-admitted."""
        self._floors: dict[int, int] = {}
        self._created: set[str] | None = None
        """Names in ``created.log`` (read at first use)."""
        self._unwritten: list[str] = []
        """Lines owed to ``created.log`` (under ``_owed_lock``: the flush thread takes them)."""
        self._owed_lock = threading.Lock()
        self._syncing = threading.Lock()
        """One ``sync_markers`` at a time: lines reach the file in the order they were owed."""
        self._entry_synced = False
        """The markers directory was synced since this process wrote ``created.log``."""

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def _write(self, name: str, marker: Marker) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(self._path(name), json.dumps(asdict(marker)).encode())

    def _create_plain(self, name: str) -> None:
        """A new replica's marker holds nothing but the default: a line of ``created.log``,
        durable with the next ``sync_markers`` (one for many new replicas)."""
        self._created_names().add(name)
        with self._owed_lock:
            self._unwritten.append(f"+{name}\n")

    def sync_markers(self) -> None:
        """Write the lines owed to ``created.log`` and make them durable: the markers created
        by ``opening(..., durable=False)``, and forgotten ones. Thread-safe: a node's flush
        passes call it (``MultiRaft.before_release``) before any message they held leaves, so
        a new replica's marker is durable before it votes or acknowledges, and the event loop
        no longer waits for an fsync per slice of a big topic's new replicas (about 4 s of
        every node's loop while a 10,000-partition topic was created)."""
        with self._syncing:
            with self._owed_lock:
                lines, self._unwritten = self._unwritten, []
            if not lines:
                return
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                data = "".join(lines).encode()
                write_whole(self.directory / CREATED_FILE, data, append=True, sync=True)
                if not self._entry_synced:  # (the file's own entry, once per process)
                    fsync_dir(self.directory)
                    self._entry_synced = True
            except BaseException:
                with self._owed_lock:  # tried again (a line twice says nothing new)
                    self._unwritten[:0] = lines
                raise

    def _created_names(self) -> set[str]:
        if self._created is None:
            self._created = self._read_created()
        return self._created

    def _read_created(self) -> set[str]:
        path = self.directory / CREATED_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return set()
        # A line cut short by a crash was never synced: no replica took part under it.
        whole = data[: data.rfind(b"\n") + 1]
        names: set[str] = set()
        forgotten = 0
        for line in whole.decode("utf-8").splitlines():
            if line.startswith("+"):
                names.add(line[1:])
            elif line.startswith("-"):
                names.discard(line[1:])
                forgotten += 1
        if len(whole) < len(data) or forgotten > len(names):  # cut the torn line, or compact
            text = "".join(f"+{name}\n" for name in sorted(names))
            write_atomic(path, text.encode("utf-8"))
        return names

    def _read(self, name: str) -> Marker | None:
        # A marker file, if any, holds more than the default (older versions also wrote the
        # default as an empty file); else the name in created.log is the default.
        path = f"{self._directory}/{name}.json"
        try:
            info = os.stat(path)
            if info.st_size == 0 and stat.S_ISREG(info.st_mode):
                return Marker()
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except FileNotFoundError:
            return Marker() if name in self._created_names() else None
        if not text:
            return Marker()  # (emptied since the stat)
        data = json.loads(text)
        return Marker(bool(data["lost"]), str(data["incident"]), int(data["vote_floor"]))

    def opening(
        self,
        group: int,
        name: str,
        directory: Path,
        durable: bool = True,
        *,
        exists: bool | None = None,
    ) -> bool:
        """Call before opening a replica's directory; True if the replica lost its state.
        ``exists``: whether ``directory`` exists, if the caller just looked.

        With ``durable=False`` a new replica's marker is durable only after ``sync_markers``,
        which the caller owes before the replica takes part in its group (a node's flush
        passes call it): opening many replicas then costs one fsync, not one each.

        While ``node_lost`` holds (this node's whole data directory was lost and its new
        incarnation is not registered yet), every replica it opens was assigned to it before
        the loss: lost too, marker or not.
        """
        marker = self._read(name)
        if marker is None:
            if self.node_lost:
                marker = Marker(lost=True, incident=uuid.uuid4().hex)
                self._write(name, marker)
            else:
                marker = Marker()
                self._create_plain(name)
                if durable:
                    self.sync_markers()
        elif not marker.lost and not (directory.exists() if exists is None else exists):
            marker = Marker(lost=True, incident=uuid.uuid4().hex, vote_floor=marker.vote_floor)
            self._write(name, marker)
        self.markers[group] = (name, marker)
        if marker.vote_floor >= 0:
            self._floors[group] = marker.vote_floor
        if marker.lost:
            self.gated.add(group)
            log.warning(
                "replica lost its state: it will not vote until its group re-admits it",
                replica=name,
                incident=marker.incident,
            )
        return marker.lost

    # node identity -----------------------------------------------------------------------
    def load_identity(self, cluster_id: str, node_id: int) -> bool:
        """Read ``identity.json``; False if this data directory has none (nor any data from
        before identities): the node is new or lost everything, and the caller asks its peers
        which, then calls ``save_identity``. A directory of another node is refused."""
        self._identity = {"cluster_id": cluster_id, "node_id": node_id}
        try:
            data = json.loads((self.data_dir / IDENTITY_FILE).read_text())
        except FileNotFoundError:
            self.incarnation = uuid.uuid4().hex
            return any(self.data_dir.iterdir())
        if data.get("cluster_id") != cluster_id or data.get("node_id") != node_id:
            raise InvalidRequestError(
                f"{self.data_dir} belongs to node {data.get('node_id')} of cluster "
                f"{data.get('cluster_id')!r}, not node {node_id} of {cluster_id!r}"
            )
        self.incarnation = str(data["incarnation"])
        self.node_lost = bool(data.get("lost", False))
        return True

    def save_identity(self) -> None:
        """Write ``identity.json``: with ``lost`` while the node's new incarnation is not yet
        registered, so a crash meanwhile still treats its old replicas as lost."""
        document = {**self._identity, "incarnation": self.incarnation, "lost": self.node_lost}
        write_atomic(self.data_dir / IDENTITY_FILE, json.dumps(document).encode())

    def registered(self) -> None:
        """This incarnation's registration is applied: replicas assigned from now on are new."""
        if self.node_lost:
            self.node_lost = False
            self.save_identity()

    # durable watermarks ------------------------------------------------------------------
    def _read_watermarks(self) -> dict[str, int]:
        try:
            data = json.loads((self.directory / WATERMARKS_FILE).read_text())
        except FileNotFoundError:
            return {}
        return {str(name): int(end) for name, end in data.items()}

    def note_durable(self, group: int, end: int) -> None:
        """Remember how far a replica's log is known durable (saved by ``save_watermarks``)."""
        entry = self.markers.get(group)
        if entry is not None and not entry[1].lost:
            self._watermarks[entry[0]] = end
            self._watermarks_moved = True

    def save_watermarks(self) -> bool:
        """Persist the watermarks if they moved since the last save; True if it wrote.

        Runs about once a second in a worker thread, and at once on the loop for a cut (see
        ``cutting``); a lock keeps a slower, older save from landing after a newer one.
        A log that reopens shorter than its saved watermark lost batches that were fsynced,
        and maybe acknowledged: a bit flip or a cut file in the active segment, whose recovery
        cuts everything from the first bad batch on. Watermarks lag by up to a save interval;
        what the log lost after the last save goes unnoticed (see ARCHITECTURE.md)."""
        with self._save_lock:
            if not self._watermarks_moved:
                return False
            self._watermarks_moved = False  # (a change from now on is saved next time)
            snapshot = dict(self._watermarks)
            if snapshot == self._saved_watermarks:
                return False
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                write_atomic(self.directory / WATERMARKS_FILE, json.dumps(snapshot).encode())
            except BaseException:
                self._watermarks_moved = True  # (tried again at the next save)
                raise
            self._saved_watermarks = snapshot
            return True

    def cutting(self, group: int, end: int) -> None:
        """A replica's log is about to be cut back to ``end`` on purpose (Raft replaces an
        uncommitted tail, or resets the log): lower its watermark durably first. Otherwise a
        crash before the next save leaves a log below its watermark, taken for lost batches;
        and a group whose majority is taken for lost cannot re-admit anyone."""
        entry = self.markers.get(group)
        if entry is None or entry[1].lost:
            return
        name = entry[0]
        mark = max(self._watermarks.get(name, -1), self._saved_watermarks.get(name, -1))
        if mark > end:
            self._watermarks[name] = end
            self._watermarks_moved = True
            self.save_watermarks()

    def check_log(self, group: int, end: int) -> bool:
        """Call after opening a replica's log; True (and the replica is lost) if the log ends
        below its saved watermark."""
        entry = self.markers.get(group)
        if entry is None:
            return False
        mark = self._watermarks.get(entry[0])
        if mark is None or end >= mark or entry[1].lost:
            return entry[1].lost
        log.warning(
            "replica log ends below what it had made durable",
            replica=entry[0],
            log_end=end,
            durable_end=mark,
        )
        self.lose(group)
        return True

    def lose(self, group: int) -> None:
        """The replica's log lost batches it had made durable (and may have acknowledged)."""
        name, marker = self.markers[group]
        if marker.lost:
            return
        marker = Marker(lost=True, incident=uuid.uuid4().hex, vote_floor=marker.vote_floor)
        self._write(name, marker)
        self.markers[group] = (name, marker)
        self.gated.add(group)

    def incident(self, group: int) -> str:
        entry = self.markers.get(group)
        return entry[1].incident if entry is not None and entry[1].lost else ""

    def recovered(self, group: int, incident: str, term: int) -> bool:
        """The group re-admitted this replica (``incident`` names the loss); ``term`` is the
        replica's current term, the highest it may have voted in before the loss."""
        entry = self.markers.get(group)
        if entry is None or not entry[1].lost or entry[1].incident != incident:
            return False
        name, _ = entry
        marker = Marker(lost=False, incident=incident, vote_floor=term)
        self._watermarks.pop(name, None)
        self._watermarks_moved = True
        self._write(name, marker)
        self.markers[group] = (name, marker)
        self._floors[group] = term
        self.gated.discard(group)
        log.info("replica re-admitted to its group", replica=name, vote_floor=term)
        return True

    def closed(self, group: int) -> None:
        self.markers.pop(group, None)
        self.gated.discard(group)
        self._floors.pop(group, None)

    def forget(self, name: str) -> None:
        """The replica's files are deleted for good (topic deleted, replica moved away).
        Like the unlink of a marker file, its line is forgotten without a sync of its own (the
        next ``sync_markers`` writes it)."""
        self._path(name).unlink(missing_ok=True)
        self._watermarks.pop(name, None)
        self._watermarks_moved = True
        created = self._created_names()
        if name in created:
            created.discard(name)
            with self._owed_lock:
                self._unwritten.append(f"-{name}\n")

    # message filters ---------------------------------------------------------------------
    def may_campaign(self, group: int) -> bool:
        """A gated replica never stands for election (the runtime does not tick it): in a
        group of one it would win without a message the filters below could drop."""
        return group not in self.gated

    @property
    def filtering(self) -> bool:
        return bool(self.gated or self._floors)

    def admits(self, group: int, message: Message) -> bool:
        """Whether an incoming message may reach the group's Raft core."""
        if message.type not in _ELECTION:
            return True
        if group in self.gated:
            return False
        floor = self._floors.get(group)
        return floor is None or message.term > floor or message.type is MessageType.TIMEOUT_NOW

    def outgoing(self, messages: list[GroupMessage]) -> list[GroupMessage]:
        """Drop the vote requests of gated replicas (they must never lead)."""
        if not self.gated:
            return messages
        gated = self.gated
        return [(g, m) for g, m in messages if g not in gated or m.type not in _CANDIDACY]
