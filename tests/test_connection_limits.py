"""Per-connection bounds of the node's client port, on real sockets: a client cannot make a
node queue unbounded work (requests beyond ``max_requests_per_connection`` are not read until
some are answered) nor unbounded replies (a client that stops reading them stops being read),
and nothing is lost: every request is answered once the client behaves."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from laminar.client import Admin, Producer
from laminar.client.connection import Connection
from laminar.framing import encode_frame
from laminar.transport import FramedProtocol
from tests.single_node import TOPIC, SingleNode, create_topic

pytestmark = pytest.mark.timeout(60)
LIMIT = 8


async def test_requests_beyond_the_limit_wait_unread_and_are_all_answered(
    tmp_path: Path,
) -> None:
    single = SingleNode(tmp_path, max_requests_per_connection=LIMIT)
    node = await single.start()
    try:
        await create_topic(single.bootstrap, TOPIC, 1)
        async with Producer(single.bootstrap) as producer:
            end = (await producer.send_and_wait(TOPIC, b"first")).offset + 1
        connection = await Connection.open(single.bootstrap)

        def fetch(body: object) -> None:
            request = body.init("fetch")  # type: ignore[attr-defined]
            request.maxWaitMs = 5000
            request.maxBytes = 1 << 20
            ask = request.init("partitions", 1)[0]
            ask.topic, ask.partition, ask.offset = TOPIC, 0, end

        parked = [asyncio.create_task(connection.request(fetch, timeout=20)) for _ in range(100)]
        await asyncio.sleep(0.5)
        served = [c for c in node.client_server._connections if c.in_flight]
        assert [c.in_flight for c in served] == [LIMIT], "the node read more than its limit"
        started = time.monotonic()
        async with Admin(single.bootstrap) as admin:  # other clients are served meanwhile
            assert TOPIC in await admin.list_topics()
        assert time.monotonic() - started < 2
        async with Producer(single.bootstrap) as producer:
            await producer.send_and_wait(TOPIC, b"wake")
        replies = await asyncio.gather(*parked)
        assert len(replies) == 100 and all(r[0].error.code == 0 for r in replies)
        connection.close()
    finally:
        await node.stop()


async def test_a_client_that_reads_no_replies_stops_being_read() -> None:
    """A server that answers every small request with 1 MiB, and a client that sends 2,000
    requests but reads nothing: the server stops reading once its write buffer is full, long
    before it has built 2 GiB of replies; once the client reads, every reply arrives."""
    handled = 0
    reply = b"r" * (1 << 20)
    servers: list[FramedProtocol] = []

    def make() -> FramedProtocol:
        def on_frame(kind: int, message: bytes, payload: memoryview) -> None:
            nonlocal handled
            handled += 1
            protocol.request_started()
            protocol.send(2, message, reply)
            protocol.request_done()

        protocol = FramedProtocol(on_frame, max_in_flight=1000)
        servers.append(protocol)
        return protocol

    loop = asyncio.get_running_loop()
    server = await loop.create_server(make, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
    requests = b"".join(b"".join(encode_frame(1, b"%08d" % i, b"")) for i in range(2000))
    writer.write(requests)
    await asyncio.sleep(1.0)
    assert 0 < handled < 200, f"{handled} MiB of replies built for a client reading none"
    assert servers[0]._reading_paused
    received = 0
    expected = 2000 * (len(reply) + len(b"".join(encode_frame(2, b"00000000", b""))))
    while received < expected:
        chunk = await asyncio.wait_for(reader.read(1 << 20), 10)
        assert chunk, "connection closed early"
        received += len(chunk)
    assert handled == 2000
    writer.close()
    server.close()
