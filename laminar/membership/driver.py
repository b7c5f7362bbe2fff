"""Runs the SWIM core over asyncio UDP: one socket and one periodic tick task per node."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

from laminar.errors import ProtocolError
from laminar.membership import codec
from laminar.membership.keyring import Keyring
from laminar.membership.messages import Ack, Message, Ping
from laminar.membership.state import Member, MemberEvent, MemberState
from laminar.membership.swim import Swim, SwimConfig
from laminar.stats import Buckets
from laminar.transport import join_address, split_address

log = structlog.get_logger(__name__)

TICK_SECONDS = 0.1  # one core tick; with SwimConfig defaults: 1 s period, 500 ms ack timeout


@dataclass(slots=True)
class DriverStats:
    datagrams_received: int = 0
    datagrams_sent: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    dropped_malformed: int = 0
    dropped_unauthenticated: int = 0
    """Datagrams not sealed with a key of the keyring (forged, foreign or plain)."""
    send_errors: int = 0
    callback_errors: int = 0
    probe_rtt: Buckets = field(default_factory=Buckets)
    """Seconds from a ping this node sent to the ack with its sequence number."""


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, driver: SwimDriver) -> None:
        self._driver = driver

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        self._driver._on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable etc.: the probe simply fails, as a lost datagram would.
        self._driver.stats.send_errors += 1


class SwimDriver:
    """A node's membership: binds UDP, ticks the core, sends its outbox, publishes events."""

    def __init__(
        self,
        node_id: int,
        meta: Mapping[str, str] | None = None,
        config: SwimConfig | None = None,
        seeds: list[str] | None = None,
        tick_seconds: float = TICK_SECONDS,
        advertise_host: str | None = None,
        advertise: str | None = None,
        keyring: Keyring | None = None,
        incarnation: int = 0,
    ) -> None:
        """With a ``keyring`` every datagram is sealed, and one not sealed with a key of the
        keyring is dropped (``stats.dropped_unauthenticated``). ``incarnation`` is the
        member's first (``Swim``): a node passes its start time in milliseconds, so that
        after a crash its peers take it for alive at once (a restart at incarnation 0 was
        alive again on its peers only 1.3 to 2 s later, once it had heard itself declared
        dead and refuted it; the node's leaders started catching it up only then)."""
        self.node_id = node_id
        self.keyring = keyring
        self.stats = DriverStats()
        self._meta = dict(meta or {})
        self._incarnation = incarnation
        self._config = config or SwimConfig()
        self._seeds = list(seeds or [])
        self._tick_seconds = tick_seconds
        self._advertise_host = advertise_host
        self._advertise = advertise  # full host:port others send to (e.g. a proxy), if not ours
        self._core: Swim | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._subscribers: list[Callable[[MemberEvent], None]] = []
        self._resolved: dict[str, tuple[str, int]] = {}
        self._pings: dict[int, float] = {}  # seq -> time.monotonic() sent, for probe_rtt

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind, join the seeds and start ticking; returns the advertised UDP address."""
        if self._transport is not None:
            raise RuntimeError("SWIM driver already started")
        if host in ("0.0.0.0", "::", "") and not (self._advertise_host or self._advertise):
            raise ValueError("binding a wildcard address needs advertise_host for the others")
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Protocol(self), local_addr=(host, port)
        )
        self._transport = transport
        bound_host, bound_port = transport.get_extra_info("sockname")[:2]
        address = self._advertise or join_address(self._advertise_host or bound_host, bound_port)
        self._core = Swim(
            self.node_id, address, self._meta, self._config, self._seeds, self._incarnation
        )
        self._flush()
        self._ticker = asyncio.create_task(self._tick_loop(), name=f"swim-tick-{self.node_id}")
        log.info("swim.started", node_id=self.node_id, address=address, seeds=self._seeds)
        return address

    async def leave(self, linger_seconds: float | None = None) -> None:
        """Announce a graceful leave and keep answering for a while so the news spreads."""
        core = self._require_core()
        core.leave()
        self._flush()
        if linger_seconds is None:
            linger_seconds = 3 * self._config.protocol_period_ticks * self._tick_seconds
        await asyncio.sleep(linger_seconds)

    async def stop(self) -> None:
        """Stop ticking and close the socket (without a leave: others will detect a failure)."""
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
        log.info("swim.stopped", node_id=self.node_id)

    # ------------------------------------------------------------------ queries

    @property
    def started(self) -> bool:
        return self._core is not None

    @property
    def address(self) -> str:
        return self._require_core().address

    @property
    def members(self) -> list[Member]:
        """Every member this node knows of; none before ``start`` (a restarting node serves
        clients while it opens its replicas, before its gossip starts)."""
        return self._core.members() if self._core is not None else []

    def member(self, node_id: int) -> Member | None:
        return self._require_core().member(node_id)

    def live_members(self) -> list[Member]:
        return [m for m in self.members if m.state is MemberState.ALIVE]

    def subscribe(self, callback: Callable[[MemberEvent], None]) -> None:
        """Call ``callback`` for every member event, on the event loop, in order."""
        self._subscribers.append(callback)

    def rejoin(self, address: str) -> None:
        """Exchange full state with a member at ``address`` this node has no record of (it was
        reaped, e.g. after a partition that outlasted ``reap_after_ticks``)."""
        self._require_core().join([address])
        self._flush()

    def update_meta(self, meta: Mapping[str, str]) -> None:
        self._require_core().update_meta(meta)
        self._flush()

    @property
    def core(self) -> Swim:
        """The state machine itself (for status and tests)."""
        return self._require_core()

    # ------------------------------------------------------------------ internals

    def _require_core(self) -> Swim:
        if self._core is None:
            raise RuntimeError("SWIM driver not started")
        return self._core

    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        core = self._require_core()
        next_at = loop.time()
        ticks = 0
        while True:
            next_at += self._tick_seconds
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            ticks += 1
            if self.keyring is not None and ticks % 10 == 0:
                self.keyring.reload_if_changed()
            core.tick()
            self._flush()
            # After a long stall (GC, an overloaded loop) drop the backlog instead of bursting.
            if loop.time() - next_at > 10 * self._tick_seconds:
                next_at = loop.time()

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        core = self._core
        if core is None:
            return
        self.stats.datagrams_received += 1
        self.stats.bytes_received += len(data)
        if self.keyring is not None:
            try:
                data = self.keyring.open(data)
            except ProtocolError as exc:
                self.stats.dropped_unauthenticated += 1
                log.debug("swim.dropped_unauthenticated", source=addr, reason=str(exc))
                return
        try:
            message = codec.decode(data)
        except ProtocolError as exc:
            self.stats.dropped_malformed += 1
            log.debug("swim.dropped_datagram", source=addr, reason=str(exc))
            return
        if type(message) is Ack:
            sent = self._pings.pop(message.seq, None)
            if sent is not None:
                self.stats.probe_rtt.observe(time.monotonic() - sent)
        core.receive(join_address(addr[0], addr[1]), message)
        self._flush()

    def _flush(self) -> None:
        core = self._core
        transport = self._transport
        if core is None:
            return
        for address, message in core.outbox():
            if transport is None:
                break
            self._send(transport, address, message)
        for event in core.events():
            log.info(
                "swim.member",
                change=event.kind.value,
                member=event.member.node_id,
                incarnation=event.member.incarnation,
            )
            for callback in self._subscribers:
                try:
                    callback(event)
                except Exception:
                    self.stats.callback_errors += 1
                    log.exception("swim.subscriber_failed", change=event.kind.value)

    def _send(self, transport: asyncio.DatagramTransport, address: str, message: Message) -> None:
        target = self._resolved.get(address)
        if target is None:
            try:
                target = split_address(address)
            except ValueError:
                self.stats.send_errors += 1
                return
            if len(self._resolved) < 4096:
                self._resolved[address] = target
        data = codec.encode(message)
        if self.keyring is not None:
            data = self.keyring.seal(data)
        try:
            transport.sendto(data, target)
        except (OSError, ValueError):  # uvloop: ValueError for a name or the other family
            self.stats.send_errors += 1
            return
        self.stats.datagrams_sent += 1
        self.stats.bytes_sent += len(data)
        if type(message) is Ping:
            pings = self._pings
            if len(pings) >= 256:  # unanswered ones (dead members): forget them
                pings.clear()
            pings[message.seq] = time.monotonic()
