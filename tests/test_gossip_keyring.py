"""Gossip authentication and encryption: the keyring alone, then SWIM drivers on real UDP sockets.

What is shown: a forged ALIVE (plain, or sealed with a key the cluster does not hold) with a
higher incarnation is dropped and counted, where without keys it re-points the member's
address; a replayed authentic datagram changes nothing (SWIM's incarnation order, not a time
window, makes old news harmless); keys rotate as in memberlist (several accepted, the first
sends), also through a keyring file that is re-read.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from laminar.errors import ProtocolError
from laminar.membership import codec
from laminar.membership.driver import SwimDriver
from laminar.membership.keyring import Keyring, parse_key, read_key_file
from laminar.membership.messages import Gossip, Update
from laminar.membership.state import MemberEvent, MemberState
from laminar.membership.swim import SwimConfig
from laminar.transport import split_address
from tests.test_swim_driver import all_alive, wait_for

TICK = 0.05
K1, K2, K3 = (os.urandom(32) for _ in range(3))


def _config(seed: int) -> SwimConfig:
    return SwimConfig(protocol_period_ticks=4, ack_timeout_ticks=2, suspicion_mult=3, seed=seed)


# the keyring alone ----------------------------------------------------------------------------
def test_seal_open_round_trip_and_rotation() -> None:
    frame = codec.encode(Gossip(1, ()))
    old, new = Keyring([K1]), Keyring([K2, K1])
    with pytest.raises(ProtocolError):
        old.open(new.seal(frame))  # K2 unknown to a keyring holding only K1
    assert new.open(old.seal(frame)) == frame  # K1 still accepted
    assert new.open(new.seal(frame)) == frame


@pytest.mark.parametrize("encrypt", [False, True])
def test_forged_tampered_and_plain_datagrams_are_refused(encrypt: bool) -> None:
    frame = codec.encode(Gossip(1, ()))
    ring = Keyring([K1], encrypt=encrypt)
    sealed = ring.seal(frame)
    for bad in (
        frame,  # plain
        Keyring([K3], encrypt=encrypt).seal(frame),  # another cluster's key
        sealed[:-1] + bytes([sealed[-1] ^ 1]),  # tampered tag
        sealed[:10] + bytes([sealed[10] ^ 1]) + sealed[11:],  # tampered body
        sealed[:3],
        b"",
    ):
        with pytest.raises(ProtocolError):
            ring.open(bad)
    assert ring.open(sealed) == frame


def test_encryption_hides_the_frame_and_hmac_keyrings_read_it() -> None:
    frame = codec.encode(Gossip(7, (Update(7, "10.0.0.7:9093", 3, MemberState.ALIVE, {}),)))
    sealed = Keyring([K1], encrypt=True).seal(frame)
    assert b"10.0.0.7" not in sealed and b"10.0.0.7" in frame
    assert Keyring([K1]).open(sealed) == frame  # a node switching encryption on still talks


def test_keys_are_base64_of_aes_sizes_and_the_file_is_reloaded(tmp_path: Path) -> None:
    assert parse_key(base64.b64encode(K1).decode()) == K1
    for bad in ("not base64!", base64.b64encode(b"short").decode()):
        with pytest.raises(ValueError):
            parse_key(bad)
    path = tmp_path / "gossip.keys"
    path.write_text(f"# primary first\n{base64.b64encode(K1).decode()}\n")
    ring = Keyring(path=path)
    assert ring.keys == [K1] and read_key_file(path) == [K1]
    path.write_text(f"{base64.b64encode(K2).decode()}\n{base64.b64encode(K1).decode()}\n")
    os.utime(path, (1, 1))  # a different mtime even within the file system's granularity
    assert ring.reload_if_changed() and ring.keys == [K2, K1]
    path.write_text("garbage\n")
    os.utime(path, (2, 2))
    assert not ring.reload_if_changed() and ring.keys == [K2, K1]  # a broken file keeps keys


# drivers on real sockets ----------------------------------------------------------------------
@pytest.fixture
async def start() -> AsyncIterator[Callable[..., asyncio.Future[SwimDriver]]]:
    drivers: list[SwimDriver] = []

    async def start_driver(
        node_id: int, keys: list[bytes] | None, seeds: list[str] = (), encrypt: bool = False
    ) -> SwimDriver:
        keyring = Keyring(keys, encrypt=encrypt) if keys else None
        driver = SwimDriver(
            node_id,
            {"peer": f"127.0.0.1:{9000 + node_id}"},
            _config(node_id),
            list(seeds),
            TICK,
            keyring=keyring,
        )
        await driver.start("127.0.0.1", 0)
        drivers.append(driver)
        return driver

    yield start_driver  # type: ignore[misc]
    for driver in drivers:
        await driver.stop()


async def _three(start: Callable[..., asyncio.Future[SwimDriver]], keys: list[bytes] | None):
    first = await start(1, keys)
    others = [await start(n, keys, [first.address]) for n in (2, 3)]
    drivers = [first, *others]
    await wait_for(lambda: all_alive(drivers, {1, 2, 3}), 10, "3 members to converge")
    return drivers


def _forged_alive(victim: SwimDriver, observer: SwimDriver) -> bytes:
    """What an attacker on the network sends: node 2 'is now' at an attacker's address."""
    member = observer.member(victim.node_id)
    assert member is not None
    update = Update(
        victim.node_id,
        member.address,
        member.incarnation + 5,
        MemberState.ALIVE,
        {"peer": "10.6.6.6:9093"},
    )
    return codec.encode(Gossip(3, (update,)))


async def _send(data: bytes, address: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(data, split_address(address))
    await asyncio.sleep(0.3)


def _repointed(driver: SwimDriver) -> list[int]:
    """Incarnations at which ``driver`` took node 2 to be at the attacker's address."""
    seen: list[int] = []

    def on_event(event: MemberEvent) -> None:
        if event.member.node_id == 2 and event.member.meta.get("peer") == "10.6.6.6:9093":
            seen.append(event.member.incarnation)

    driver.subscribe(on_event)
    return seen


async def test_without_keys_a_forged_alive_repoints_a_member(start) -> None:
    """The attack the keyring stops (node 2 refutes it a moment later, until the next one)."""
    one, two, _ = await _three(start, None)
    seen = _repointed(one)
    await _send(_forged_alive(two, one), one.address)
    assert seen


async def test_with_keys_forged_alive_is_dropped_and_counted(start) -> None:
    one, two, _ = await _three(start, [K1])
    before = one.member(2)
    seen = _repointed(one)
    forged = _forged_alive(two, one)
    await _send(forged, one.address)  # plain
    await _send(Keyring([K3]).seal(forged), one.address)  # sealed with a foreign key
    assert one.stats.dropped_unauthenticated >= 2 and not seen
    after = one.member(2)
    assert after.meta == before.meta and after.incarnation == before.incarnation
    assert all_alive([one, two], {1, 2, 3})


async def test_replayed_datagram_changes_nothing(start) -> None:
    """An authentic datagram captured earlier carries the sender's old incarnation and meta:
    once the sender has moved on, replaying it is old news and SWIM ignores it."""
    one, _, _ = await _three(start, [K1])
    spy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    spy.bind(("127.0.0.1", 0))
    spy.setblocking(False)
    spy_address = f"127.0.0.1:{spy.getsockname()[1]}"
    try:
        four = await start(4, [K1], [spy_address, one.address])  # joins: sends its state to both
        loop = asyncio.get_running_loop()
        captured = await asyncio.wait_for(loop.sock_recv(spy, 2048), 5)
        assert Keyring([K1]).open(captured)  # authentic
        await wait_for(lambda: one.member(4) is not None, 5, "node 4 to join")
        four.update_meta({"peer": "127.0.0.1:9999"})  # a new incarnation with new meta
        await wait_for(
            lambda: one.member(4).meta.get("peer") == "127.0.0.1:9999", 5, "new meta to spread"
        )
        current = one.member(4)
        dropped = one.stats.dropped_unauthenticated
        for _ in range(3):
            await _send(captured, one.address)
        replayed = one.member(4)
        assert one.stats.dropped_unauthenticated == dropped  # accepted as authentic ...
        assert replayed.meta == current.meta  # ... and ignored as old news
        assert replayed.incarnation == current.incarnation
        assert replayed.state is MemberState.ALIVE
    finally:
        spy.close()


async def test_rotation_and_a_stranger(start) -> None:
    """Mid-rotation nodes send with different first keys yet hear each other; a node holding
    none of the keys never joins, and its datagrams are counted."""
    one = await start(1, [K1, K2])
    two = await start(2, [K2, K1], [one.address])
    three = await start(3, [K2, K1], [one.address], encrypt=True)
    await wait_for(lambda: all_alive([one, two, three], {1, 2, 3}), 10, "rotating members")
    stranger = await start(4, [K3], [one.address])
    await wait_for(lambda: one.stats.dropped_unauthenticated > 0, 5, "stranger dropped")
    await asyncio.sleep(0.5)
    assert one.member(4) is None and {m.node_id for m in stranger.members} == {4}
