"""Consumer groups end to end: real nodes, a steady producer, real consumer *processes*.

Each member is a `python -m tests.group_worker` process (auto-commit off, an explicit commit
after every batch and in its revoke listener) logging its assignment changes, processed
records and commits; tests/group_history.py reads and checks the logs. The test process
produces (acks=all, values are sequence numbers) and polls the group's committed offsets
throughout. Nodes run with a 3 s session timeout and 0.5 s heartbeats. The first test runs the
issue's scenario in phases on one 3-node cluster, 12 partitions, RF 3:

* a member holding a processed, uncommitted batch is SIGKILLed: the others consume its
  partitions within session timeout + 1 s (measured), and process that batch again;
* a member joins: partitions move to it incrementally, the others only give some up, keep the
  rest and keep consuming them;
* the coordinator's node is SIGKILLed: every partition is consumed and committed further;
* a static member is SIGKILLed and started again (within the session timeout): it gets the
  same partitions back and no other member's assignment changes;
* the dead node comes back, a member joins and the coordinator's node is SIGKILLed in the
  middle of the revocation handshake;
* at the end (producer stopped, members drained and SIGTERMed) over the whole run: no two
  members ever owned a partition at once, nobody processed a record it did not own, every
  acknowledged record was processed, a record processed twice was first processed by a member
  that lost the partition without a handshake (killed, fenced) at or after its last commit,
  and the polled committed offsets never went back nor ahead of what had been processed.

The second test pauses a member (SIGSTOP) past its session timeout, twice: once right after it
processed a batch it has not committed, once at a random moment. Resumed, it cannot commit,
reads nothing of its old partitions until assigned again, and never moves the group's
committed offsets. Then the member holds a batch (busy outside getmany, heartbeats going on)
while another member joins: it misses its rebalance timeout and is fenced; it commits only
what it owns again, and reads nothing of its old partitions until assigned again. The same
history checks as above run at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.cluster_fixture import ClusterHandle, start_cluster
from tests.group_harness import (
    Feed,
    OffsetPoller,
    Workers,
    balanced,
    create_topic,
    drained,
    say,
    stopped,
    wait_until,
    wait_until_caught_up,
)
from tests.group_history import (
    History,
    build_history,
    commits_without_owning,
    committed_beyond_processed,
    committed_went_back,
    never_released,
    ok_commits,
    overlapping_owners,
    owned_now,
    processed_times,
    records_after,
    unjustified_duplicates,
    unprocessed,
)
from tests.group_worker import HOLD_SECONDS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to see a process stopped"),
]

SESSION = 3.0
HEARTBEAT = 0.5
NODE_ARGS = [
    "--group-session-timeout",
    str(SESSION),
    "--group-heartbeat-interval",
    str(HEARTBEAT),
]
REBALANCE_TIMEOUT_MS = 2_000  # the zombie's: how long it may take to give partitions up


def final_checks(workers: Workers, feed: Feed, poller: OffsetPoller) -> History:
    """Checks 1, 4 and 5 over the whole run; raises with every violation found."""
    history = build_history(workers.members())
    duplicates, count = unjustified_duplicates(history)
    problems = {
        "bookkeeping": history.violations,
        "two owners at once": overlapping_owners(history),
        "ownership never released": never_released(history),
        "committed offset went back": committed_went_back(poller.samples),
        "committed beyond processed": committed_beyond_processed(poller.samples, history),
        "acknowledged but not processed": unprocessed(history, feed.acked),
        "unjustified duplicates": duplicates,
    }
    say(
        f"{len(feed.acked)} acknowledged, {len(feed.failed)} failed sends, "
        f"{len(history.processed)} distinct records processed, {count} processed more than once, "
        f"{len(poller.samples)} offset samples ({poller.errors} failed polls)"
    )
    found = {k: v for k, v in problems.items() if v}
    if found:
        text = "\n".join(f"{k} ({len(v)}):\n  " + "\n  ".join(v[:15]) for k, v in found.items())
        raise AssertionError(f"{text}\n{workers.explain()}")
    return history


# ---------------------------------------------------------------------------------- test


async def test_group_of_processes_under_kills_joins_and_coordinator_loss(tmp_path: Path) -> None:
    topic, group, partitions = "orders", "g-procs", 12
    cluster = start_cluster(tmp_path, nodes=3, extra_args=NODE_ARGS)
    workers = Workers(tmp_path, cluster.bootstrap, topic, group)
    feed = Feed(cluster.bootstrap, topic)
    poller = OffsetPoller(cluster.bootstrap, group)
    try:
        await create_topic(cluster.bootstrap, topic, partitions)
        await feed.start()
        await poller.start()
        for name, instance in (("static", "static-1"), ("a", None), ("b", None)):
            workers.start(name, instance)
        took = await wait_until(
            lambda: balanced(workers.owned(), ["static", "a", "b"], partitions),
            30,
            "3 balanced members",
            workers.explain,
        )
        say(f"3 members balanced after {took:.2f}s: {workers.owned()}")
        await member_killed(workers, "a", ["static", "b"], partitions)
        await member_joins(workers, "c", ["static", "b"], partitions)
        members = ["static", "b", "c"]
        await coordinator_killed(cluster, workers, poller, members, partitions)
        await static_member_restarted(workers, "static", "static-1", ["b", "c"], partitions)
        members = ["static2", "b", "c"]
        await join_during_coordinator_loss(cluster, workers, poller, members, "d", partitions)
        await drain_and_stop(workers, feed)
        history = final_checks(workers, feed, poller)
        final = poller.latest()
        ends: dict[int, int] = {}
        for p, offset in feed.acked.values():
            ends[p] = max(ends.get(p, 0), offset + 1)
        short = {p: (final.get(p), end) for p, end in ends.items() if final.get(p, -1) < end}
        assert not short, f"final committed offsets short of the last records: {short}"
        again = [r for r in workers.uncommitted if len(history.processed[r]) < 2]
        assert not again, f"the killed member's uncommitted {again} were not processed again"
        spans = [i for s in history.intervals.values() for i in s]
        hows = {how: sum(1 for i in spans if i.how == how) for how in {i.how for i in spans}}
        say(f"ownership intervals by how they ended: {hows}")
    finally:
        workers.stop_all()
        await feed.close()
        await poller.close()
        cluster.stop()


async def member_killed(workers: Workers, victim: str, others: list[str], partitions: int) -> None:
    """Check 2: a SIGKILLed member's partitions are consumed by the others within the session
    timeout + 1 s."""
    await asyncio.sleep(1.0)
    workers.signal(victim, signal.SIGHUP)  # it holds its next batch uncommitted
    await wait_until(
        lambda: any(e["ev"] == "holding" for e in workers.events(victim)),
        10,
        f"{victim} to hold a processed batch",
        workers.explain,
    )
    theirs = set(workers.owned()[victim])
    killed = workers.kill(victim)
    held = [e["recs"] for e in workers.events(victim) if e["ev"] == "records"][-1]
    workers.uncommitted = [(p, offset) for p, offset, _ in held]

    def resumed_at() -> dict[int, float]:
        firsts: dict[int, float] = {}
        for name in others:
            events = workers.events(name)
            for p in theirs:
                times = processed_times(events, p, killed)
                if times:
                    firsts[p] = min(firsts.get(p, times[0]), times[0])
        return firsts

    await wait_until(
        lambda: set(resumed_at()) == theirs,
        SESSION + 8,
        f"partitions {sorted(theirs)} of killed member {victim} to be consumed again",
        lambda: workers.explain(killed),
    )
    delays = {p: round(t - killed, 3) for p, t in sorted(resumed_at().items())}
    say(f"after SIGKILL of {victim}, its partitions were consumed again after {delays}")
    assert max(delays.values()) <= SESSION + 1.0, (
        f"partitions of the killed member took {delays}s (> {SESSION + 1}s)\n"
        f"{workers.explain(killed)}"
    )
    await wait_until(
        lambda: balanced(workers.owned(), others, partitions),
        10,
        f"{others} balanced",
        lambda: workers.explain(killed),
    )


async def member_joins(workers: Workers, new: str, others: list[str], partitions: int) -> None:
    """Check 3: partitions move to a joining member incrementally; the others are only asked
    to give some up, keep the rest, and keep consuming those."""
    before = workers.owned()
    joined = time.time()
    workers.start(new)
    took = await wait_until(
        lambda: balanced(workers.owned(), [*others, new], partitions),
        20,
        f"{new} to join and the group to balance",
        lambda: workers.explain(joined),
    )
    settled = time.time()
    after = workers.owned()
    say(f"{new} joined, balanced after {took:.2f}s: {after}")
    moved = 0
    for name in others:
        events = [e for e in workers.events(name) if e["t"] > joined]
        changes = [e for e in events if e["ev"] in ("assigned", "lost", "revoked")]
        revoked = {p for e in changes if e["ev"] == "revoked" for p in e["tps"]}
        moved += len(revoked)
        assert all(e["ev"] == "revoked" for e in changes), (
            f"{name} got {changes} while {new} joined (only revocations expected)\n"
            f"{workers.explain(joined)}"
        )
        assert not revoked & after[name], (
            f"{name} had {sorted(revoked & after[name])} revoked yet owns them at the end"
        )
        assert after[name] == before[name] - revoked, (name, before[name], revoked, after[name])
    assert moved == len(after[new]), f"{moved} partitions revoked for {len(after[new])} moved"
    gaps = {}
    for name in others:
        events = workers.events(name)
        for p in after[name]:
            times = sorted(
                t for t in {joined, settled, *processed_times(events, p, joined)} if t <= settled
            )
            gaps[p] = round(max(b - a for a, b in itertools.pairwise(times)), 3)
    say(f"kept partitions' longest wait for a processed batch during the join: {gaps}")


async def coordinator_killed(
    cluster: ClusterHandle,
    workers: Workers,
    poller: OffsetPoller,
    members: list[str],
    partitions: int,
) -> None:
    """Check 4: with the coordinator's node SIGKILLed, every partition is consumed and
    committed further (the poller checks at the end that no committed offset went back)."""
    await asyncio.sleep(1.0)
    coordinator = await poller.coordinator()
    committed_before = dict(poller.latest())
    node_killed = time.time()
    cluster.kill(coordinator)
    say(f"killed node {coordinator}, the group's coordinator")

    def consumed_since(t0: float) -> set[int]:
        out = set()
        for name in members:
            for e in workers.events(name):
                if e["ev"] == "records" and e["t"] > t0:
                    out.update(r[0] for r in e["recs"])
        return out

    await wait_until(
        lambda: consumed_since(node_killed + 0.5) == set(range(partitions)),
        30,
        "every partition to be consumed after the coordinator's node died",
        lambda: workers.explain(node_killed),
    )
    say(f"every partition consumed again {time.time() - node_killed:.2f}s after the node kill")
    await wait_until(
        lambda: all(
            poller.latest().get(p, -1) > committed_before.get(p, -1) for p in range(partitions)
        ),
        30,
        "every partition's committed offset to move past its value at the node kill",
        lambda: f"before {committed_before}\nnow {poller.latest()}\n{workers.explain(node_killed)}",
    )
    new_coordinator = await poller.coordinator()
    poller.dead_node = coordinator
    say(
        f"commits advanced on every partition {time.time() - node_killed:.2f}s after the node "
        f"kill (new coordinator: node {new_coordinator})"
    )
    assert new_coordinator != coordinator
    await wait_until(
        lambda: balanced(workers.owned(), members, partitions),
        20,
        "the members balanced after the node kill",
        lambda: workers.explain(node_killed),
    )


async def static_member_restarted(
    workers: Workers, name: str, instance: str, others: list[str], partitions: int
) -> None:
    """Check 6: a static member SIGKILLed and started again within the session timeout gets
    its partitions back, and no other member's assignment changes (not even once the old
    incarnation's session would have run out)."""
    successor = f"{name}2"
    await wait_until(
        lambda: balanced(workers.owned(), [name, *others], partitions),
        20,
        "the members balanced before the static restart",
        workers.explain,
    )
    owned = workers.owned()
    theirs, others_before = owned[name], {n: owned[n] for n in others}
    killed = workers.kill(name)
    workers.start(successor, instance)
    took = await wait_until(
        lambda: owned_now(workers.events(successor)) == theirs,
        SESSION + 5,
        f"the restarted static member to get {sorted(theirs)} back",
        lambda: workers.explain(killed),
    )
    ready = next(e["t"] for e in workers.events(successor) if e["ev"] == "ready")
    say(
        f"static member restarted: connected and joining {ready - killed:.2f}s after the kill, "
        f"its partitions back {took:.2f}s after the kill"
    )
    await asyncio.sleep(SESSION + 1.0)  # past the old incarnation's session: still no change
    changes = [
        (n, e)
        for n in others
        for e in workers.events(n)
        if e["t"] > killed and e["ev"] in ("assigned", "revoked", "lost")
    ]
    assert not changes, f"others' assignment changed: {changes}\n{workers.explain(killed)}"
    mine = [e for e in workers.events(successor) if e["ev"] in ("assigned", "revoked", "lost")]
    assert [e["ev"] for e in mine] == ["assigned"] and set(mine[0]["tps"]) == theirs, (
        f"restarted static member: {mine}, expected one assignment of {sorted(theirs)}"
    )
    assert {n: workers.owned()[n] for n in others} == others_before


async def join_during_coordinator_loss(
    cluster: ClusterHandle,
    workers: Workers,
    poller: OffsetPoller,
    members: list[str],
    new: str,
    partitions: int,
) -> None:
    """Checks 1, 3-5 under more stress: the dead node comes back, then a member joins and
    the coordinator's node is SIGKILLed in the middle of the revocation handshake."""
    assert poller.dead_node is not None
    cluster.start_node(poller.dead_node)
    back = time.time()
    await wait_until_caught_up(cluster.bootstrap, timeout=30)
    say(f"node {poller.dead_node} back and caught up after {time.time() - back:.2f}s")
    coordinator = await poller.coordinator()
    joined = time.time()
    workers.start(new)

    def revoking() -> bool:
        return any(
            e["ev"] == "revoked" and e["t"] > joined for n in members for e in workers.events(n)
        )

    await wait_until(revoking, 20, "a revocation for the new member", workers.explain)
    node_killed = time.time()
    cluster.kill(coordinator)
    took = await wait_until(
        lambda: balanced(workers.owned(), [*members, new], partitions),
        30,
        f"{new} to join although the coordinator's node {coordinator} died mid-handshake",
        lambda: workers.explain(joined),
    )
    changes = [
        (n, e["ev"], e["tps"])
        for n in [*members, new]
        for e in workers.events(n)
        if e["t"] > joined and e["ev"] in ("assigned", "revoked", "lost")
    ]
    say(
        f"killed coordinator node {coordinator} {node_killed - joined:.2f}s into {new}'s join; "
        f"balanced {took:.2f}s after the kill: {workers.owned()}; changes {changes}"
    )


async def drain_and_stop(workers: Workers, feed: Feed) -> None:
    """Stop producing, let the members process everything, SIGTERM them (they commit in
    their revoke listener and leave)."""
    await feed.stop()
    took = await wait_until(
        lambda: drained(workers, feed),
        30,
        "members to process every acknowledged record",
        workers.explain,
    )
    say(f"drained {took:.2f}s after the producer stopped")
    await asyncio.sleep(0.5)
    problems = await workers.terminate(15)
    assert not problems, problems
    await asyncio.sleep(0.5)  # a last offset sample after the final commits


async def test_a_paused_member_is_fenced(tmp_path: Path) -> None:
    topic, group, partitions = "zevents", "g-zombie", 6
    cluster = start_cluster(tmp_path, nodes=3, extra_args=NODE_ARGS)
    workers = Workers(tmp_path, cluster.bootstrap, topic, group)
    feed = Feed(cluster.bootstrap, topic, rate=100)
    poller = OffsetPoller(cluster.bootstrap, group, interval=0.1)
    try:
        await create_topic(cluster.bootstrap, topic, partitions)
        await feed.start()
        await poller.start()
        workers.start("zombie", rebalance_timeout_ms=REBALANCE_TIMEOUT_MS)
        workers.start("b")
        await wait_until(
            lambda: balanced(workers.owned(), ["zombie", "b"], partitions),
            30,
            "2 balanced members",
            workers.explain,
        )
        await pause_and_resume(workers, poller, partitions, self_stop=True)
        await pause_and_resume(workers, poller, partitions, self_stop=False)
        await revocation_times_out(workers, poller, partitions)
        await feed.stop()
        await wait_until(lambda: drained(workers, feed), 30, "members to drain", workers.explain)
        problems = await workers.terminate(15)
        assert not problems, problems
        await asyncio.sleep(0.3)
        final_checks(workers, feed, poller)
    finally:
        workers.stop_all()
        await feed.close()
        await poller.close()
        cluster.stop()


async def pause_and_resume(
    workers: Workers, poller: OffsetPoller, partitions: int, *, self_stop: bool
) -> None:
    """Stop "zombie" past its session timeout (with SIGSTOP: sent by itself right after it
    processed a batch it has not committed yet, or by the test at any moment), wait until "b"
    consumes everything, resume it, and check what it does next."""
    what = "self-stop with a batch in hand" if self_stop else "external SIGSTOP"
    pid = workers.procs["zombie"].pid
    await asyncio.sleep(1.0)
    old = workers.owned()["zombie"]
    workers.signal("zombie", signal.SIGUSR1 if self_stop else signal.SIGSTOP)
    await wait_until(lambda: stopped(pid), 10, "the member to stop", workers.explain)
    paused = time.time()
    if self_stop:
        paused = [e for e in workers.events("zombie") if e["ev"] == "pausing"][-1]["t"]
    took = await wait_until(
        lambda: (
            owned_now(workers.events("b")) == set(range(partitions))
            and all(processed_times(workers.events("b"), p, paused) for p in old)
        ),
        SESSION + 8,
        "b to own and consume every partition",
        lambda: workers.explain(paused),
    )
    say(f"{what}: b consumed the paused member's partitions {took:.2f}s after the pause")
    await asyncio.sleep(max(0.0, paused + SESSION + 1.0 - time.time()))
    resumed = time.time()
    workers.signal("zombie", signal.SIGCONT)
    workers.pauses.setdefault("zombie", []).append((paused, resumed))
    took = await wait_until(
        lambda: balanced(workers.owned(), ["zombie", "b"], partitions),
        20,
        "the resumed member to be assigned again",
        lambda: workers.explain(paused),
    )
    events = [e for e in workers.events("zombie") if e["t"] >= resumed]
    say(f"{what}: balanced again {took:.2f}s after the resume: {workers.owned()}")
    # It reads nothing of its old partitions until assigned again.
    reassigned: set[int] = set()
    for e in events:
        if e["ev"] == "assigned":
            reassigned |= set(e["tps"])
        if e["ev"] == "records":
            early = {r[0] for r in e["recs"] if r[0] in old and r[0] not in reassigned}
            assert not early, f"resumed member processed {early} before re-assignment: {e}"
    # Commits it starts after the resume fail (typed) until it is assigned again, or it
    # noticed the loss first. One started before the pause may have reached the coordinator
    # before the pause too (only its answer is read after the resume): then its successor
    # started from it, proof it was taken while the member still owned the partition.
    first_assigned = next((e["t"] for e in events if e["ev"] == "assigned"), float("inf"))
    commits = [e for e in events if e["ev"] == "commit" and e["t"] < first_assigned]
    late = [e for e in commits if e["t0"] >= resumed]
    lost = [e for e in events if e["ev"] == "lost" and e["t"] < first_assigned]
    assert lost or late, f"resumed member neither lost its partitions nor committed: {events}"
    assert not [e for e in late if e["ok"]], f"the resumed zombie committed: {late}"
    errors = {e["error"] for e in late}
    assert errors <= {"FencedMemberEpochError", "UnknownMemberIdError"}, late
    if self_stop:
        assert late, "the zombie did not try to commit the batch it held"
    b_events = workers.events("b")
    for e in commits:
        if e["t0"] < resumed and e["ok"]:
            for key, offset in e["offsets"].items():
                starts = [r[1] for r in records_after(b_events, paused) if r[0] == int(key)]
                assert starts and starts[0] >= offset, (
                    f"the zombie's commit {e}, started before the pause, was applied after "
                    f"b took p{key} over (b started at {starts[:1]})"
                )
    ended = [
        (e.get("error", "ok"), e["offsets"], "sent before pause" if e["t0"] < resumed else "after")
        for e in commits
    ]
    say(f"{what}: commits ended after the resume {ended}, lost {[e['tps'] for e in lost]}")
    # The group's committed offsets change only by commits of the partitions' owners.
    allowed = ok_commits(workers.events("b"))
    for p, offsets in ok_commits(workers.events("zombie"), after=first_assigned).items():
        allowed[p] |= offsets
    at_resume = dict(next((o for t, o in reversed(poller.samples) if t <= resumed), {}))
    for t, offsets in poller.samples:
        stray = {
            p: o
            for p, o in offsets.items()
            if t > resumed and p in old and o not in allowed[p] and o != at_resume.get(p)
        }
        assert not stray, f"committed offsets {stray} seen at {t:.3f} came from no owner's commit"


async def revocation_times_out(workers: Workers, poller: OffsetPoller, partitions: int) -> None:
    """A member busy with a batch (outside getmany, heartbeats going on) when a joining member
    takes partitions from it misses its rebalance timeout: the coordinator fences it. Its
    commit of that batch fails, it reads nothing of its old partitions until assigned again,
    and the group settles with the three members."""
    await asyncio.sleep(1.0)
    old = workers.owned()["zombie"]
    workers.signal("zombie", signal.SIGHUP)  # it holds its next batch (10 s) before committing
    await wait_until(
        lambda: any(e["ev"] == "holding" for e in workers.events("zombie")),
        10,
        "the member to hold a batch",
        workers.explain,
    )
    holding = [e["t"] for e in workers.events("zombie") if e["ev"] == "holding"][-1]
    workers.start("c")
    took = await wait_until(
        lambda: balanced(workers.owned(), ["zombie", "b", "c"], partitions),
        30,
        "the group to settle with c after the busy member was fenced",
        lambda: workers.explain(holding),
    )
    await wait_until(  # the commit of the batch it held
        lambda: any(e["ev"] == "commit" and e["t"] > holding for e in workers.events("zombie")),
        HOLD_SECONDS + 5,
        "the busy member to commit its batch",
        lambda: workers.explain(holding),
    )
    events = [e for e in workers.events("zombie") if e["t"] > holding]
    changes = [(e["ev"], e["tps"]) for e in events if e["ev"] in ("assigned", "revoked", "lost")]
    commits = [e for e in events if e["ev"] == "commit"]
    say(
        f"busy member fenced by its rebalance timeout: settled {took:.2f}s after it got busy; "
        f"its changes {changes}; the commit of its batch {commits[:1]}"
    )
    assert changes and changes[0][0] == "lost", f"expected it to lose {sorted(old)}: {changes}"
    # The batch it held is committed once it is done, as the member it is by then: that
    # succeeds only for partitions its new incarnation was assigned again meanwhile.
    stray = commits_without_owning(events, old)
    assert not stray, f"the fenced member committed partitions it did not own: {stray}"
    reassigned: set[int] = set()
    for e in events:
        if e["ev"] == "assigned":
            reassigned |= set(e["tps"])
        if e["ev"] == "records":
            early = {r[0] for r in e["recs"] if r[0] in old and r[0] not in reassigned}
            assert not early, f"fenced member processed {early} before re-assignment: {e}"
