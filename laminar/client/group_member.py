"""A Consumer's membership in a group: the heartbeat task, reconciliation and commits.

``Membership`` (membership.py) decides; this module does the I/O and drives the Consumer's
fetch assignment, which stays the only thing the fetch machinery knows about. Invariants:

* a partition leaves the fetch assignment (buffered records dropped, in-flight fetches
  ignored) *before* the revoke listener runs, and is reported released only after it and the
  auto-commit are done, so its next owner starts from what this member committed;
* lost partitions (fenced, unknown member, client-side session expiry) are dropped without a
  commit and reported to ``on_partitions_lost``;
* auto-commit commits positions the application has been handed (what ``getmany`` or
  ``async for`` returned before the current call), so it is at-least-once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from laminar.client.group_types import OffsetAndMetadata
from laminar.client.groups import GroupClient, is_retriable_group_error
from laminar.client.log import get_logger
from laminar.client.membership import Membership
from laminar.client.types import TopicPartition
from laminar.errors import (
    FencedMemberEpochError,
    LaminarError,
    StaleMemberEpochError,
    UnknownMemberIdError,
)

if TYPE_CHECKING:
    from laminar.client.consumer import Consumer

log = get_logger(__name__)

Partitions = set[TopicPartition]
Callback = Callable[[Partitions], Awaitable[None] | None]

HEARTBEAT_RETRY = 0.2
LEAVE_TIMEOUT = 5.0
COMMIT_ATTEMPTS = 3


class RebalanceListener:
    """Override what you need; every method may be async. Commits work inside
    ``on_partitions_revoked`` (the partitions are still this member's until it returns), not
    inside ``on_partitions_lost`` (another member may own them already)."""

    async def on_partitions_revoked(self, revoked: Partitions) -> None:
        """Called after these stopped being read and before they are released."""

    async def on_partitions_assigned(self, assigned: Partitions) -> None:
        """Called once these are positioned at their committed offsets and being read."""

    async def on_partitions_lost(self, lost: Partitions) -> None:
        """Called after these were taken away without a handshake (fenced, session expired).
        By default the same as a revocation."""
        await self.on_partitions_revoked(lost)


class CallbackListener(RebalanceListener):
    """A listener made of the Consumer's ``on_partitions_*`` callables (sync or async)."""

    def __init__(
        self,
        revoked: Callback | None = None,
        assigned: Callback | None = None,
        lost: Callback | None = None,
    ) -> None:
        self._revoked = revoked
        self._assigned = assigned
        self._lost = lost

    async def on_partitions_revoked(self, revoked: Partitions) -> None:
        await _maybe_await(self._revoked, revoked)

    async def on_partitions_assigned(self, assigned: Partitions) -> None:
        await _maybe_await(self._assigned, assigned)

    async def on_partitions_lost(self, lost: Partitions) -> None:
        await _maybe_await(self._lost or self._revoked, lost)


async def _maybe_await(callback: Callback | None, partitions: Partitions) -> None:
    if callback is None:
        return
    result = callback(partitions)
    if inspect.isawaitable(result):
        await result


class GroupMember:
    """Joins ``group`` for one Consumer once it subscribes, until ``close()``."""

    def __init__(
        self,
        consumer: Consumer,
        group: str,
        *,
        instance_id: str | None,
        rack: str | None,
        rebalance_timeout_ms: int,
        enable_auto_commit: bool,
        auto_commit_interval_ms: int,
        listener: RebalanceListener,
    ) -> None:
        self.consumer = consumer
        self.group = group
        self.membership = Membership(group, instance_id=instance_id)
        self.rack = rack
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval = auto_commit_interval_ms / 1000
        self.listener = listener
        self.client = GroupClient(consumer.cluster)
        self._revoking: dict[TopicPartition, int] = {}
        """Positions of partitions whose revoke listener is running: still committable."""
        self._committed: dict[TopicPartition, int] = {}
        """What this member last committed or found committed, to skip no-op commits."""
        self._wake = asyncio.Event()
        self._replied = asyncio.Event()
        self._heartbeats: asyncio.Task[None] | None = None
        self._reconciling: asyncio.Task[None] | None = None
        self._auto_commit: asyncio.Task[None] | None = None
        self._listener_tasks: set[asyncio.Task[None]] = set()
        self._next_auto_commit = 0.0
        self._sent_join = False
        self._closing = False
        self._revoke_done: asyncio.Future[None] | None = None
        """Set while a revocation is under way: getmany waits for it before returning."""
        self._lost = asyncio.Event()
        """Set when everything owned is lost (a new generation): a revocation waiting for the
        application to come back into getmany has nothing left to give up."""

    # ------------------------------------------------------------------------ public side
    def subscribe(self, topics: Iterable[str]) -> None:
        if self.membership.subscribe(topics):
            self._wake.set()
        if self._heartbeats is None:
            self._heartbeats = asyncio.create_task(self._heartbeat_loop())
            self._heartbeats.add_done_callback(self._task_done)

    @property
    def subscribed(self) -> bool:
        """False: the consumer assigns partitions itself and commits from outside the group
        (member id "", epoch -1: accepted only while the group has no members)."""
        return self._heartbeats is not None

    async def before_poll(self) -> None:
        """Called at the start of every getmany: a revocation waiting for the application to
        finish its records runs to the end first (so no record of a revoked partition is
        returned after it), then the session check and maybe an auto-commit of what earlier
        calls returned (the application is done with those)."""
        self.consumer._handed.clear()  # back in getmany: done with what it returned
        while self._revoke_done is not None:
            await asyncio.shield(self._revoke_done)
        self.check_session()
        if not self.enable_auto_commit or not self.membership.owned:
            return
        now = asyncio.get_running_loop().time()
        if now < self._next_auto_commit or self._auto_commit is not None:
            return
        self._next_auto_commit = now + self.auto_commit_interval
        offsets = self._consumed_offsets(processed=True)
        if offsets:
            self._auto_commit = asyncio.create_task(self._background_commit(offsets))

    def check_session(self) -> None:
        """No heartbeat answered for a session timeout: the coordinator has removed us, so
        stop handing out records of those partitions now, before any other await."""
        if self.membership.session_expired(_now_ms()):
            lost = self.membership.expire()
            self._lost.set()
            log.warning("group session expired; partitions lost", group=self.group, lost=len(lost))
            self._drop(lost)
            self._spawn_listener(self.listener.on_partitions_lost, lost)

    async def commit(
        self, offsets: Mapping[TopicPartition, int | tuple[int, str]] | None = None
    ) -> None:
        """Commit ``offsets``, or the positions of everything the application was handed."""
        if offsets is None:
            await self._commit(self._consumed_offsets())
            return
        await self._commit(
            {TopicPartition(*tp): _offset_and_metadata(value) for tp, value in offsets.items()}
        )

    async def committed(self, tp: TopicPartition) -> int | None:
        tp = TopicPartition(*tp)
        found = await self.client.fetch_offsets(self.group, [tp])
        return found[tp].offset if tp in found else None

    async def close(self, *, failed: bool = False) -> None:
        """Commit (auto-commit), run the revoke listener, leave the group at once.

        Auto-commit commits everything returned so far, or with ``failed`` (the application
        stopped on an error) only up to what the latest getmany returned."""
        self._closing = True
        for task in (self._heartbeats, self._reconciling):
            if task is not None:
                task.cancel()
        await asyncio.gather(
            *(t for t in (self._heartbeats, self._reconciling) if t is not None),
            return_exceptions=True,
        )
        if self._auto_commit is not None:
            await asyncio.gather(self._auto_commit, return_exceptions=True)
        owned = set(self.membership.owned)
        if owned:
            returned = self.consumer._group_positions(owned)
            positions = self._drop(owned)
            if not failed:
                positions = returned
            self._revoking.update(positions)
            try:
                if self.enable_auto_commit:
                    await self._commit_quietly(_with_metadata(positions))
                await self.listener.on_partitions_revoked(owned)
            except Exception as exc:
                log.warning("revoke on close failed", group=self.group, error=str(exc))
            finally:
                self._revoking.clear()
        if self._sent_join:
            member = self.membership
            try:
                await self.client.leave(
                    self.group,
                    member.member_id,
                    member.epoch,
                    keep_assignment=member.instance_id is not None,
                    timeout=LEAVE_TIMEOUT,
                )
            except (ConnectionError, OSError, LaminarError) as exc:
                log.debug("leave failed", group=self.group, error=str(exc))
        self.membership.left()
        await asyncio.gather(*self._listener_tasks, return_exceptions=True)

    # ------------------------------------------------------------------------- heartbeats
    async def _heartbeat_loop(self) -> None:
        while not self._closing:
            self._wake.clear()
            member = self.membership
            sent = member.request()
            sent_ms = _now_ms()
            try:
                self._sent_join = True
                reply = await self.client.heartbeat(
                    self.group,
                    sent.member_id,
                    sent.member_epoch,
                    topics=sent.topics,
                    owned=sent.owned,
                    rebalance_timeout_ms=self.rebalance_timeout_ms,
                    instance_id=member.instance_id,
                    rack=self.rack,
                    timeout=max(1.0, member.session_timeout_ms / 3000),
                )
            except (UnknownMemberIdError, FencedMemberEpochError) as exc:
                if sent.member_id == member.member_id:
                    await self._fenced(exc)
                continue
            except (ConnectionError, OSError, LaminarError) as exc:
                if not is_retriable_group_error(exc):
                    log.warning("group heartbeat refused", group=self.group, error=str(exc))
                    self.consumer._report(exc)
                    await self._sleep(member.heartbeat_interval_ms / 1000)
                    continue
                log.debug("group heartbeat failed", group=self.group, error=str(exc))
                self.check_session()
                await self._sleep(HEARTBEAT_RETRY)
                continue
            if member.on_reply(sent, reply, sent_ms):
                self._replied.set()
                self._replied = asyncio.Event()
                if member.plan() and (self._reconciling is None or self._reconciling.done()):
                    self._reconciling = asyncio.create_task(self._reconcile())
                    self._reconciling.add_done_callback(self._task_done)
            await self._sleep(member.heartbeat_interval_ms / 1000)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _fenced(self, error: LaminarError) -> None:
        lost = self.membership.fenced()
        self._lost.set()
        log.warning(
            "group member fenced; partitions lost, joining again",
            group=self.group,
            error=str(error),
            lost=len(lost),
        )
        self._drop(lost)
        if lost:
            await self._run_listener(self.listener.on_partitions_lost, lost)

    # ----------------------------------------------------------------------- reconciling
    async def _reconcile(self) -> None:
        member = self.membership
        while not self._closing:
            plan = member.plan()
            if not plan:
                return
            generation = member.generation
            if plan.revoke:
                await self._revoke(set(plan.revoke), generation)
                if generation == member.generation:
                    member.revoked(plan.revoke)
                    self._wake.set()  # releasing them is what lets their next owner start
                continue
            await self._assign(set(plan.assign), generation)

    async def _revoke(self, revoke: Partitions, generation: int) -> None:
        """Give up ``revoke`` once the application is inside getmany (as in Kafka, where the
        revocation runs inside poll): until then it may still be working on records of them,
        and their next owner must not start before it is done. If they are lost meanwhile
        (fenced, session expired), they were reported to ``on_partitions_lost`` already: no
        revocation then, and the next incarnation's reconciliation goes on at once."""
        done = self._revoke_done = asyncio.get_running_loop().create_future()
        try:
            await self._until_polling(generation)
            if generation != self.membership.generation:
                return
            positions = self._drop(revoke)
            self._revoking.update(positions)
            try:
                if self.enable_auto_commit:
                    await self._commit_quietly(_with_metadata(positions))
                await self._run_listener(self.listener.on_partitions_revoked, revoke)
            finally:
                for tp in revoke:
                    self._revoking.pop(tp, None)
        finally:
            self._revoke_done = None
            done.set_result(None)

    async def _until_polling(self, generation: int) -> None:
        """Wait until the application is inside getmany, or ``generation`` is over."""
        polling = self.consumer._polling
        if polling.is_set() or generation != self.membership.generation:
            return
        lost = self._lost = asyncio.Event()
        waits = [asyncio.ensure_future(polling.wait()), asyncio.ensure_future(lost.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _assign(self, assign: Partitions, generation: int) -> None:
        member = self.membership
        try:
            found = await self.client.fetch_offsets(self.group, assign)
        except (ConnectionError, OSError, LaminarError) as exc:
            log.debug("fetching committed offsets failed", group=self.group, error=str(exc))
            await asyncio.sleep(HEARTBEAT_RETRY)
            return
        if generation != member.generation:
            return
        take = assign & member.target
        starts = {tp: (found[tp].offset if tp in found else None) for tp in take}
        for tp, offset in starts.items():
            if offset is not None:
                self._committed[tp] = offset
        try:
            await self.consumer._group_add(starts)
        except (ConnectionError, OSError, LaminarError) as exc:
            log.debug("positioning new partitions failed", group=self.group, error=str(exc))
            self._drop(take)
            await asyncio.sleep(HEARTBEAT_RETRY)
            return
        stray = {tp for tp in take if tp not in member.target or generation != member.generation}
        if stray:  # taken away while being positioned: never read them
            self._drop(stray)
        take -= stray
        if not take:
            return
        member.assigned(take)
        await self._run_listener(self.listener.on_partitions_assigned, take)

    # -------------------------------------------------------------------------- commits
    def _consumed_offsets(self, processed: bool = False) -> dict[TopicPartition, OffsetAndMetadata]:
        """Positions after what was returned (``processed``: before the latest getmany's)."""
        mine = self.membership.owned if self.subscribed else self.consumer.assignment()
        positions = self.consumer._group_positions(mine, processed=processed)
        positions.update(self._revoking)
        return {
            tp: OffsetAndMetadata(offset)
            for tp, offset in positions.items()
            if self._committed.get(tp) != offset
        }

    async def _commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        if not offsets:
            return
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            member = self.membership
            member_id, epoch = (member.member_id, member.epoch) if self.subscribed else ("", -1)
            try:
                await self.client.commit(
                    self.group, offsets, member_id=member_id, member_epoch=epoch
                )
            except StaleMemberEpochError:
                if attempt == COMMIT_ATTEMPTS:
                    raise
                replied = self._replied
                self._wake.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(member.heartbeat_interval_ms / 1000):
                        await replied.wait()
                continue
            except (UnknownMemberIdError, FencedMemberEpochError):
                self._wake.set()  # the next heartbeat finds out and rejoins
                raise
            for tp, value in offsets.items():
                self._committed[tp] = value.offset
            return

    async def _commit_quietly(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        try:
            await self._commit(
                {tp: v for tp, v in offsets.items() if self._committed.get(tp) != v.offset}
            )
        except (ConnectionError, OSError, LaminarError) as exc:
            log.warning("auto-commit failed", group=self.group, error=str(exc))

    async def _background_commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        try:
            # Only what is still ours: a revocation may have committed and released some.
            mine = self.membership.owned | set(self._revoking)
            await self._commit_quietly({tp: v for tp, v in offsets.items() if tp in mine})
        finally:
            self._auto_commit = None

    # ----------------------------------------------------------------------------- glue
    def _task_done(self, task: asyncio.Task[None]) -> None:
        """A bug in the membership must not go unnoticed: the next getmany raises it."""
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            log.error("group membership task failed", group=self.group, error=repr(error))
            assert error is not None
            self.consumer._report(error)

    def _drop(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self.consumer._group_drop(tps)

    async def _run_listener(
        self, method: Callable[[Partitions], Awaitable[None]], tps: Iterable[TopicPartition]
    ) -> None:
        try:
            await method(set(tps))
        except Exception as exc:
            log.warning("rebalance listener failed", group=self.group, error=repr(exc))
            self.consumer._report(exc)

    def _spawn_listener(
        self, method: Callable[[Partitions], Awaitable[None]], tps: Iterable[TopicPartition]
    ) -> None:
        task = asyncio.create_task(self._run_listener(method, tps))
        self._listener_tasks.add(task)
        task.add_done_callback(self._listener_tasks.discard)


def _now_ms() -> int:
    return int(asyncio.get_running_loop().time() * 1000)


def _with_metadata(positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, Any]:
    return {tp: OffsetAndMetadata(offset) for tp, offset in positions.items()}


def _offset_and_metadata(value: int | tuple[int, str]) -> OffsetAndMetadata:
    if isinstance(value, int):
        return OffsetAndMetadata(value)
    offset, metadata = value
    return OffsetAndMetadata(offset, metadata)
