"""The asyncio UDP driver: real sockets on 127.0.0.1 with random ports, several members in-process.

Timing is scaled down (50 ms ticks, 200 ms protocol period) so failure detection takes about a
second; bounds below are generous because the test machine is shared.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import AsyncIterator, Callable

import pytest

from laminar.membership import codec
from laminar.membership.driver import SwimDriver
from laminar.membership.messages import Gossip, Ping, Update
from laminar.membership.swim import EventKind, MemberEvent, MemberState, SwimConfig
from laminar.transport import split_address

TICK = 0.05


def _config(seed: int) -> SwimConfig:
    return SwimConfig(
        protocol_period_ticks=4,
        ack_timeout_ticks=2,
        suspicion_mult=3,
        sync_period_ticks=40,
        join_retry_ticks=4,
        seed=seed,
    )


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until ``predicate()``; returns the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def states(driver: SwimDriver) -> dict[int, MemberState]:
    return {m.node_id: m.state for m in driver.members}


def all_alive(drivers: list[SwimDriver], ids: set[int]) -> bool:
    return all({n for n, s in states(d).items() if s is MemberState.ALIVE} == ids for d in drivers)


@pytest.fixture
async def cluster() -> AsyncIterator[list[SwimDriver]]:
    """Four members: node 1 first, the others joining through it."""
    first = SwimDriver(1, {"raft": "127.0.0.1:9001"}, _config(1), tick_seconds=TICK)
    seed = await first.start("127.0.0.1", 0)
    drivers = [first]
    for node_id in (2, 3, 4):
        driver = SwimDriver(
            node_id, {"raft": f"127.0.0.1:900{node_id}"}, _config(node_id), [seed], TICK
        )
        await driver.start("127.0.0.1", 0)
        drivers.append(driver)
    await wait_for(lambda: all_alive(drivers, {1, 2, 3, 4}), 10, "4 members to converge")
    yield drivers
    for driver in drivers:
        await driver.stop()


async def test_join_exposes_members_with_addresses_and_meta(cluster: list[SwimDriver]) -> None:
    view = {m.node_id: m for m in cluster[3].members}
    assert sorted(view) == [1, 2, 3, 4]
    for node_id, member in view.items():
        assert member.address == cluster[node_id - 1].address
        host, port = split_address(member.address)
        assert host == "127.0.0.1" and port > 0
        assert member.meta == {"raft": f"127.0.0.1:900{node_id}"}
        assert member.incarnation == 0 and member.state is MemberState.ALIVE
    assert all(d.stats.dropped_malformed == 0 for d in cluster)


async def test_stopped_member_is_detected_dead_and_events_published(
    cluster: list[SwimDriver],
) -> None:
    seen: list[MemberEvent] = []

    def broken(event: MemberEvent) -> None:
        raise RuntimeError("a subscriber bug must not stop membership")

    cluster[0].subscribe(broken)
    cluster[0].subscribe(seen.append)
    await cluster[2].stop()
    took = await wait_for(
        lambda: all(states(d)[3] is MemberState.DEAD for d in (cluster[0], cluster[1], cluster[3])),
        15,
        "node 3 to be declared dead",
    )
    # Minimum suspicion here is 3 periods (600 ms) plus up to ~3 periods to first probe it.
    assert took < 15
    kinds = [e.kind for e in seen if e.member.node_id == 3]
    assert kinds[-1] is EventKind.DEAD and EventKind.SUSPECT in kinds
    assert states(cluster[0])[1] is MemberState.ALIVE  # nobody else suffered
    assert cluster[0].stats.callback_errors == len(seen)


@pytest.mark.parametrize("first_incarnation", [0, 1_000])
async def test_a_restarted_member_starting_above_its_old_incarnation_needs_no_refutation(
    cluster: list[SwimDriver], first_incarnation: int
) -> None:
    # A crashed node comes back on a new port. Its peers hold it dead at incarnation 0: one
    # restarting at 0 is believed only after it heard that and refuted it; one starting
    # above (a node passes its start time in ms) is alive at its first message.
    await cluster[2].stop()
    others = (cluster[0], cluster[1], cluster[3])
    await wait_for(lambda: all(states(d)[3] is MemberState.DEAD for d in others), 15, "death")
    seed = cluster[0].address
    back = SwimDriver(
        3, {"raft": "127.0.0.1:9003"}, _config(3), [seed], TICK, incarnation=first_incarnation
    )
    await back.start("127.0.0.1", 0)
    try:
        await wait_for(lambda: all(states(d)[3] is MemberState.ALIVE for d in others), 10, "life")
        assert (back.core.stats.refutations > 0) == (first_incarnation == 0)
    finally:
        await back.stop()


async def test_accused_member_refutes_with_higher_incarnation(cluster: list[SwimDriver]) -> None:
    target = cluster[1]
    before = target.core.incarnation
    accusation = Update(2, target.address, before, MemberState.SUSPECT, {}, 4)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        # Tell node 1 that node 2 is suspect, as a member's gossip would.
        sock.sendto(codec.encode(Gossip(4, (accusation,))), split_address(cluster[0].address))
        await wait_for(lambda: target.core.incarnation > before, 10, "node 2 to refute")
    refuted = target.core.incarnation
    await wait_for(
        lambda: all(d.member(2).incarnation == refuted for d in cluster),  # type: ignore[union-attr]
        10,
        "the refutation to reach everyone",
    )
    assert all(states(d)[2] is MemberState.ALIVE for d in cluster)


async def test_graceful_leave_is_seen_as_left(cluster: list[SwimDriver]) -> None:
    seen: list[MemberEvent] = []
    cluster[0].subscribe(seen.append)
    await cluster[3].leave(linger_seconds=0.5)
    await cluster[3].stop()
    await wait_for(
        lambda: all(states(d)[4] is MemberState.LEFT for d in cluster[:3]), 10, "node 4 LEFT"
    )
    await asyncio.sleep(1.5)  # long enough that a missed leave would have turned into DEAD
    assert all(states(d)[4] is MemberState.LEFT for d in cluster[:3])
    assert [e.kind for e in seen if e.member.node_id == 4] == [EventKind.LEFT]


async def test_malformed_datagrams_are_dropped_and_counted(cluster: list[SwimDriver]) -> None:
    victim = cluster[0]
    good = codec.encode(Ping(2, 1, 1))
    rng = random.Random(3)
    junk: list[bytes] = [b"", b"x", bytes(15), bytes(64), good[:-1], good + b"\0"]
    for _ in range(40):
        flipped = bytearray(good)
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        junk.append(bytes(flipped))
    junk += [rng.randbytes(rng.randint(1, 1500)) for _ in range(40)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for datagram in junk:
            sock.sendto(datagram, split_address(victim.address))
        await wait_for(
            lambda: victim.stats.dropped_malformed == len(junk), 5, "every bad datagram counted"
        )
    # Still fully working: a metadata change made after the garbage reaches everyone.
    victim.update_meta({"raft": "127.0.0.1:9999"})
    await wait_for(
        lambda: all(d.member(1).meta == {"raft": "127.0.0.1:9999"} for d in cluster),  # type: ignore[union-attr]
        10,
        "the new metadata to spread",
    )
    assert all_alive(cluster, {1, 2, 3, 4})
    assert victim.stats.dropped_malformed == len(junk)


async def test_wildcard_bind_needs_an_advertised_host() -> None:
    driver = SwimDriver(9, config=_config(9), tick_seconds=TICK)
    with pytest.raises(ValueError, match="advertise_host"):
        await driver.start("0.0.0.0", 0)
    driver = SwimDriver(9, config=_config(9), tick_seconds=TICK, advertise_host="127.0.0.1")
    address = await driver.start("0.0.0.0", 0)
    try:
        assert split_address(address)[0] == "127.0.0.1"
        assert [m.address for m in driver.members] == [address]
    finally:
        await driver.stop()
