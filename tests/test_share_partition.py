"""Unit and model-based tests of the share-partition state machine (laminar/queues)."""

from __future__ import annotations

import random

import pytest

from laminar.errors import (
    ERRORS_BY_CODE,
    InvalidRequestError,
    LaminarError,
    ReceiptExpiredError,
)
from laminar.queues.partition import (
    Acknowledgement,
    DeadLetter,
    Receipt,
    ShareConfig,
    SharePartition,
)
from laminar.queues.records import (
    Acked,
    Acquired,
    Archived,
    DeadLettered,
    Extended,
    Released,
    Snapshot,
    StartMoved,
    decode,
    encode,
    replay,
)
from tests.share_model import ShareModel

CFG = ShareConfig(lock_ms=1000, max_deliveries=3, max_in_flight=100)


def make(end: int = 10, config: ShareConfig = CFG, start: int | None = None) -> SharePartition:
    sp = SharePartition(config, 0, start=start)
    sp.end_offset(end)
    return sp


def offsets(reply) -> list[int]:
    return [d.offset for d in reply.value]


def rebuild(sp: SharePartition, now: int, log: list | None = None) -> SharePartition:
    """A failover that keeps every record written so far (``log`` accumulates them)."""
    log = [] if log is None else log
    log += sp.take_batch()
    return SharePartition(sp.config, now, records=log)


# --------------------------------------------------------------------------- acquire


def test_acquire_hands_out_the_lowest_offsets_in_order_up_to_the_end() -> None:
    sp = make(end=5)
    r = sp.acquire("a", 3, 100)
    assert offsets(r) == [0, 1, 2]
    assert all(d.delivery_count == 1 and d.lock_until_ms == 1100 for d in r.value)
    assert r.value[0].receipt == Receipt("a", 0, 1)
    assert offsets(sp.acquire("b", 10, 100)) == [3, 4]  # nothing at or beyond the end
    assert sp.acquire("b", 10, 100).value == []
    sp.end_offset(3)  # the end only grows
    sp.end_offset(7)
    assert offsets(sp.acquire("b", 10, 100)) == [5, 6]


def test_acquire_lock_per_call_and_argument_errors() -> None:
    sp = make()
    assert sp.acquire("a", 1, 0, lock_ms=50).value[0].lock_until_ms == 50
    for bad in (
        lambda: sp.acquire("a", 0, 0),
        lambda: sp.acquire("a", 1, 0, lock_ms=0),
        lambda: sp.acquire("a", 1, 0, lock_ms=CFG.max_lock_ms + 1),
        lambda: sp.acquire("", 1, 0),
    ):
        with pytest.raises(InvalidRequestError):
            bad()


def test_nothing_is_handed_out_at_or_beyond_start_plus_max_in_flight() -> None:
    sp = make(end=1000, config=ShareConfig(lock_ms=1000, max_in_flight=10))
    assert sp.end == 10  # the end is clamped to the window
    got = sp.acquire("a", 50, 0)
    assert offsets(got) == list(range(10))
    assert sp.acquire("a", 50, 0).value == []
    sp.ack(got.value[0].receipt, 1)
    sp.end_offset(1000)
    assert offsets(sp.acquire("a", 50, 1)) == [10]  # the window moved by one
    assert len(sp.state.slots) <= 10


# --------------------------------------------------------------------------- settle


def test_ack_is_final_and_moves_the_start_over_the_done_prefix() -> None:
    sp = make(end=4)
    ds = sp.acquire("a", 4, 0).value
    sp.ack(ds[1].receipt, 1)
    assert sp.start == 0  # offset 0 is still acquired
    sp.ack(ds[0].receipt, 1)
    assert sp.start == 2 and 0 not in sp.state.slots and 1 not in sp.state.slots
    sp.tick(10_000)  # the other locks expire: only 2 and 3 come back
    assert offsets(sp.acquire("b", 10, 10_000)) == [2, 3]


def test_stale_receipts_are_refused_with_a_typed_error() -> None:
    sp = make(end=3)
    d0, d1, d2 = sp.acquire("a", 3, 0).value
    sp.ack(d0.receipt, 1)
    with pytest.raises(ReceiptExpiredError):
        sp.ack(d0.receipt, 2)  # already acked
    with pytest.raises(ReceiptExpiredError):
        sp.ack(Receipt("b", 1, 1), 2)  # another member's offset
    with pytest.raises(ReceiptExpiredError):
        sp.release(d1.receipt, 1000)  # the lock ran out at 1000 (no tick needed)
    again = sp.acquire("b", 5, 1000).value
    assert [(d.offset, d.delivery_count) for d in again] == [(1, 2), (2, 2)]
    with pytest.raises(ReceiptExpiredError):
        sp.ack(d2.receipt, 1001)  # an older delivery of an offset someone else now holds
    sp.ack(again[1].receipt, 1001)
    assert ERRORS_BY_CODE[30] is ReceiptExpiredError
    assert issubclass(ReceiptExpiredError, LaminarError)


def test_release_comes_back_before_undelivered_offsets_and_counts_deliveries() -> None:
    sp = make(end=6)
    d = sp.acquire("a", 2, 0).value
    sp.release(d[1].receipt, 5)
    got = sp.acquire("b", 2, 6).value
    assert [(x.offset, x.delivery_count) for x in got] == [(1, 2), (2, 1)]


def test_release_with_delay_is_not_redelivered_before_the_delay() -> None:
    sp = make(end=2)
    d = sp.acquire("a", 1, 0).value[0]
    sp.release(d.receipt, 10, delay_ms=500)
    assert offsets(sp.acquire("b", 5, 509)) == [1]
    assert offsets(sp.acquire("b", 5, 510)) == [0]
    with pytest.raises(InvalidRequestError):
        sp.release(Receipt("b", 0, 2), 511, delay_ms=-1)


def test_reject_archives_and_the_dead_letter_is_confirmed_before_the_start_moves() -> None:
    sp = make(end=3)
    d = sp.acquire("a", 3, 0).value
    sp.reject(d[0].receipt, 1)
    sp.ack(d[1].receipt, 1)
    assert sp.start == 0  # the archived offset is not copied yet
    assert sp.take_dead_letters() == [DeadLetter(0, 1, "rejected")]
    assert sp.take_dead_letters() == []  # handed out once per instance
    sp.dead_letters_failed([0])
    sp.dead_letters_failed([0])  # twice: still handed out once
    assert sp.take_dead_letters() == [DeadLetter(0, 1, "rejected")]
    assert sp.take_dead_letters() == []
    sp.dead_letters_copied([0])
    assert sp.start == 2
    sp.tick(5000)
    assert offsets(sp.acquire("b", 5, 5000)) == [2]  # never 0 again


def test_dead_letters_not_confirmed_are_handed_out_again_after_a_failover() -> None:
    sp = make(end=2)
    sp.reject(sp.acquire("a", 1, 0).value[0].receipt, 1)
    assert len(sp.take_dead_letters()) == 1
    sp2 = rebuild(sp, 2)
    assert sp2.take_dead_letters() == [DeadLetter(0, 1, "rejected")]


def test_extend_keeps_the_lock_and_can_shorten_it() -> None:
    sp = make(end=2)
    d = sp.acquire("a", 1, 0).value[0]
    sp.extend(d.receipt, 900, 5000)
    assert sp.acquire("b", 5, 5000).value[0].offset == 1  # 0 is locked until 5900
    assert offsets(sp.acquire("b", 5, 5899)) == []
    sp.extend(d.receipt, 5899, 1)  # shorter
    assert offsets(sp.acquire("b", 5, 5900)) == [0]
    with pytest.raises(InvalidRequestError):
        sp.extend(Receipt("b", 0, 2), 5901, 0)


def test_lock_expiry_comes_back_then_dead_letters_at_max_deliveries() -> None:
    sp = make(end=1)
    now = 0
    for count in (1, 2, 3):
        d = sp.acquire("a", 1, now).value
        assert [(x.offset, x.delivery_count) for x in d] == [(0, count)]
        now += 1000
        sp.tick(now)
    assert sp.acquire("a", 1, now).value == []
    assert sp.take_dead_letters() == [DeadLetter(0, 3, "max deliveries")]
    sp.dead_letters_copied([0])
    assert sp.start == 1


def test_release_at_max_deliveries_archives() -> None:
    sp = make(end=1, config=ShareConfig(lock_ms=1000, max_deliveries=1))
    sp.release(sp.acquire("a", 1, 0).value[0].receipt, 1)
    assert sp.take_dead_letters() == [DeadLetter(0, 1, "max deliveries")]


def test_member_gone_makes_its_acquisitions_available_at_once() -> None:
    sp = make(end=4)
    a = sp.acquire("a", 2, 0).value
    sp.acquire("b", 1, 0)
    sp.member_gone("a", 10)
    got = sp.acquire("c", 5, 10).value
    assert [(d.offset, d.delivery_count) for d in got] == [(0, 2), (1, 2), (3, 1)]
    with pytest.raises(ReceiptExpiredError):
        sp.ack(a[0].receipt, 11)


# --------------------------------------------------------------------------- driver input


def test_defer_parks_undelivered_records_without_counting_a_delivery() -> None:
    sp = SharePartition(CFG, 0)
    sp.defer(1, 3, 700)
    sp.end_offset(4)
    assert offsets(sp.acquire("a", 10, 0)) == [0, 3]
    assert offsets(sp.acquire("a", 10, 699)) == []
    got = sp.acquire("a", 10, 700).value
    assert [(d.offset, d.delivery_count) for d in got] == [(1, 1), (2, 1)]
    sp.take_batch()
    sp.defer(0, 4, 9999)  # all delivered already: nothing changes, no record
    assert sp.take_batch() == ()


def test_defer_reported_again_writes_nothing_and_keeps_the_due_time() -> None:
    sp = SharePartition(CFG, 0)
    sp.defer(0, 2, 500)
    sp.take_batch()
    sp.defer(0, 2, 500)
    assert sp.take_batch() == ()


def test_skip_offsets_are_never_delivered_and_count_as_done() -> None:
    sp = SharePartition(CFG, 0)
    sp.skip(0, 2)
    assert sp.start == 2
    sp.skip(3, 4)
    sp.end_offset(6)
    assert offsets(sp.acquire("a", 10, 0)) == [2, 4, 5]
    sp.ack(Receipt("a", 2, 1), 1)
    assert sp.start == 4


def test_driver_ranges_past_the_window_are_refused() -> None:
    sp = SharePartition(ShareConfig(max_in_flight=10), 0)
    with pytest.raises(InvalidRequestError):
        sp.skip(5, 11)
    with pytest.raises(InvalidRequestError):
        sp.defer(10, 11, 5)
    with pytest.raises(InvalidRequestError):
        sp.skip(3, 2)


def test_advance_start_drops_everything_below() -> None:
    sp = make(end=10)
    d = sp.acquire("a", 5, 0).value
    sp.reject(d[2].receipt, 1)
    sp.advance_start(4)
    assert sp.start == 4 and min(sp.state.slots) == 4
    assert sp.take_dead_letters() == []
    with pytest.raises(ReceiptExpiredError):
        sp.ack(d[0].receipt, 2)
    sp.ack(d[4].receipt, 2)
    assert sp.start == 5
    assert SharePartition(CFG, 0, start=7).start == 7


def test_new_group_start_is_a_record() -> None:
    sp = SharePartition(CFG, 0, start=42)
    assert sp.take_batch() == (StartMoved(42),)


# --------------------------------------------------------------------------- batches


def test_batch_acknowledge_is_per_item() -> None:
    sp = make(end=6)
    d = sp.acquire("a", 6, 0).value
    items = [
        Acknowledgement(d[0].receipt, "ack"),
        Acknowledgement(Receipt("zz", 1, 1), "ack"),
        Acknowledgement(d[1].receipt, "release", 100),
        Acknowledgement(d[1].receipt, "ack"),  # settled earlier in this batch
        Acknowledgement(d[2].receipt, "reject"),
        Acknowledgement(d[3].receipt, "extend", 5000),
        Acknowledgement(d[3].receipt, "ack"),  # an extend does not settle
        Acknowledgement(d[4].receipt, "extend", -5),
        Acknowledgement(d[5].receipt, "bogus"),  # type: ignore[arg-type]
    ]
    results = sp.acknowledge(items, 1).value
    kinds = [None if r is None else type(r) for r in results]
    assert kinds == [
        None,
        ReceiptExpiredError,
        None,
        ReceiptExpiredError,
        None,
        None,
        None,
        InvalidRequestError,
        InvalidRequestError,
    ]
    assert sp.state.slots[3].state == 2  # acked
    assert sp.state.slots[4].state == 1 and sp.state.slots[5].state == 1


def test_acks_of_contiguous_offsets_are_one_range_record() -> None:
    sp = make(end=500, config=ShareConfig(max_in_flight=1000))
    ds = sp.acquire("a", 500, 0).value
    assert sp.take_batch() == (Acquired("a", 30_000, ((0, 500, 1),)),)
    sp.acknowledge([Acknowledgement(d.receipt, "ack") for d in reversed(ds)], 1)
    assert sp.take_batch() == (Acked(((0, 500),)),)
    assert sp.start == 500 and not sp.state.slots


# --------------------------------------------------------------------------- durability


def test_replies_wait_for_their_records() -> None:
    sp = make(end=3)
    r = sp.acquire("a", 2, 0)
    assert r.after == 1 and not sp.is_released(r)
    sp.records_committed(1)
    assert sp.is_released(r)
    a = sp.ack(r.value[0].receipt, 1)
    assert a.after == 2 and not sp.is_released(a)
    with pytest.raises(ValueError):
        sp.records_committed(3)
    with pytest.raises(ReceiptExpiredError):  # errors are raised at once, nothing written
        sp.ack(r.value[0].receipt, 1)
    assert sp.written == 2
    sp.records_lost()
    with pytest.raises(LaminarError):
        sp.acquire("a", 1, 2)


def test_failover_keeps_acks_acquisitions_counts_and_delays() -> None:
    sp = make(end=6)
    log: list = []
    d = sp.acquire("a", 4, 0).value
    sp.ack(d[0].receipt, 10)
    sp.release(d[1].receipt, 10, delay_ms=5000)
    sp.extend(d[2].receipt, 10, 3000)
    sp2 = rebuild(sp, 2000, log)
    assert sp2.state == sp.state
    sp2.end_offset(6)
    # 1 is delayed until 5010, 2 is locked until 2000+3000, 3 until 2000+1000: 4, 5 go out.
    long = 100_000
    assert offsets(sp2.acquire("b", 10, 2999, long)) == [4, 5]
    assert offsets(sp2.acquire("b", 10, 3000, long)) == [3]
    assert offsets(sp2.acquire("b", 10, 4999, long)) == []
    sp2.ack(d[2].receipt, 4999)  # a receipt from before the failover is still valid
    got = sp2.acquire("b", 10, 5010, long).value
    assert [(x.offset, x.delivery_count) for x in got] == [(1, 2)]
    assert 0 not in sp2.state.slots and sp2.start == 1


def test_checkpoint_replays_to_the_same_state_and_records_round_trip() -> None:
    sp = make(end=20)
    d = sp.acquire("a", 10, 0).value
    sp.ack(d[0].receipt, 1)
    sp.ack(d[5].receipt, 1)
    sp.reject(d[6].receipt, 1)
    sp.release(d[7].receipt, 1, delay_ms=77)
    sp.defer(15, 17, 999)
    before = list(sp.take_batch())
    assert sp.checkpoint() == 1
    (snap,) = sp.take_batch()
    assert isinstance(snap, Snapshot)
    assert replay([snap]) == sp.state == replay(before)
    samples = [
        Acquired("m", 5, ((1, 3, 2),)),
        Extended(7, ((1, 2),)),
        Acked(((0, 1), (4, 9))),
        Released(12, ((3, 4),)),
        Archived("rejected", ((5, 6),)),
        DeadLettered(((5, 6),)),
        StartMoved(9),
        snap,
    ]
    for record in samples:
        assert decode(encode(record)) == record
    with pytest.raises(ValueError):
        decode(b'["Nope", 1]')


def test_indexes_stay_bounded_over_many_cycles() -> None:
    cfg = ShareConfig(lock_ms=60_000, max_in_flight=200)
    sp = SharePartition(cfg, 0)
    for i in range(300):
        sp.end_offset((i + 1) * 100)
        ds = sp.acquire("a", 100, i).value
        assert len(ds) == 100
        sp.acknowledge([Acknowledgement(d.receipt, "ack") for d in ds], i)
        sp.take_batch()
    sizes = sp.index_sizes()
    assert sizes["slots"] == 0 and sizes["deadlines"] == 0
    assert max(sizes.values()) <= 1024 + 2 * cfg.max_in_flight, sizes


# --------------------------------------------------------------------------- model-based


def _model_run(seed: int, steps: int = 400) -> None:
    rng = random.Random(seed)
    cfg = ShareConfig(
        lock_ms=rng.choice((300, 1000)),
        max_deliveries=rng.choice((1, 2, 3)),
        max_in_flight=rng.choice((8, 20)),
    )
    sp = SharePartition(cfg, 0)
    model = ShareModel(cfg)
    log: list = []  # every record written (all durable: loss is the simulation's business)
    checkpoint_at = -1
    now = 0
    hw = 0
    members = ["a", "b", "c"]
    receipts: list[Receipt] = []
    where = (
        f"seed {seed}; replay: PYTHONPATH=. .venv/bin/python -c "
        f"'from tests.test_share_partition import _model_run; _model_run({seed})'"
    )

    def both(name: str, *args, model_args: tuple | None = None):
        """Call ``name`` on both; they must agree on raising (and on the error's type)."""
        try:
            got, err = getattr(sp, name)(*args), None
        except LaminarError as e:
            got, err = None, type(e)
        try:
            want, merr = getattr(model, name)(*(args if model_args is None else model_args)), None
        except LaminarError as e:
            want, merr = None, type(e)
        assert err == merr, (where, name, err, merr)
        return got, want

    for _ in range(steps):
        now += rng.choice((0, 0, 50, 200, 700))
        op = rng.random()
        if op < 0.12:
            hw += rng.randint(1, 6)
            hi = min(hw, sp.window_end)
            lo = sp.end
            # Report what lies in [lo, hi): sometimes a skip or a delay first.
            if hi > lo and rng.random() < 0.3:
                a = rng.randint(lo, hi - 1)
                b = rng.randint(a, hi)
                if rng.random() < 0.5:
                    both("skip", a, b)
                else:
                    t = now + rng.choice((0, 100, 1500))
                    both("defer", a, b, t)
            both("end_offset", hi)
        elif op < 0.40:
            m, n = rng.choice(members), rng.randint(1, 6)
            lock = rng.choice((None, None, 100, 2000))
            got, want = both("acquire", m, n, now, lock)
            assert [(d.offset, d.delivery_count, d.lock_until_ms) for d in got.value] == want, where
            receipts += [d.receipt for d in got.value]
        elif op < 0.70 and receipts:
            items = []
            for _ in range(rng.randint(1, 5)):
                r = rng.choice(receipts)
                if rng.random() < 0.1:
                    r = Receipt(rng.choice(members), r.offset, r.delivery_count)
                kind = rng.choice(("ack", "ack", "ack", "release", "reject", "extend"))
                ms = rng.choice((0, 0, 300, 1500, -1)) if kind != "ack" else 0
                items.append((r, kind, ms))
            got, want = both(
                "acknowledge",
                [Acknowledgement(r, k, ms) for r, k, ms in items],
                now,
                model_args=(
                    [(r.member_id, r.offset, r.delivery_count, k, ms) for r, k, ms in items],
                    now,
                ),
            )
            assert [None if e is None else type(e) for e in got.value] == want, where
        elif op < 0.75:
            m = rng.choice(members)
            both("member_gone", m, now)
        elif op < 0.82:
            both("tick", now)
        elif op < 0.90:
            limit = rng.choice((None, 1, 2))
            got, want = both("take_dead_letters", limit)
            assert [(d.offset, d.delivery_count, d.reason) for d in got] == want, where
            handed = [d.offset for d in got]
            if handed and rng.random() < 0.3:
                both("dead_letters_failed", handed)
            elif handed:
                both("dead_letters_copied", handed)
        elif op < 0.92:
            to = sp.start + rng.randint(0, 3)
            both("advance_start", to)
        elif op < 0.95:
            log += sp.take_batch()
            sp.checkpoint()
            checkpoint_at = len(log)
        else:
            # Fail over from the full log, or from the newest checkpoint on.
            log += sp.take_batch()
            records = log[checkpoint_at:] if checkpoint_at >= 0 and rng.random() < 0.5 else log
            assert replay(records) == sp.state, where
            sp = SharePartition(cfg, now, records=records)
            model.failover(now)
        # Observable state: the durable state equals the model's, and replay(records) too.
        assert sp.start == model.start, where
        assert sp.end == model.end, where
        assert _observable(sp) == model.observable(), where
        if rng.random() < 0.1:
            log += sp.take_batch()
            assert replay(log) == sp.state, where
            if checkpoint_at >= 0:
                assert replay(log[checkpoint_at:]) == sp.state, where


def _observable(sp: SharePartition) -> dict[int, tuple]:
    names = ("avail", "held", "acked", "archiving", "archived")
    return {
        o: (names[s.state], s.count, s.member, s.lock_ms, s.due_ms, s.reason)
        for o, s in sp.state.slots.items()
        if not (s.state == 0 and s.count == 0 and s.due_ms == 0)
    }


@pytest.mark.parametrize("chunk", range(4))
def test_matches_the_reference_model(chunk: int) -> None:
    for seed in range(chunk * 75, chunk * 75 + 75):
        _model_run(seed)


def test_describe_counts_each_kind_of_offset() -> None:
    sp = SharePartition(CFG, 0)
    sp.defer(3, 5, 10_000)
    sp.end_offset(10)
    d = sp.acquire("a", 3, 0).value
    sp.reject(d[0].receipt, 1)
    view = sp.describe(1)
    assert (view.start, view.end) == (0, 10)
    assert (view.acquired, view.delayed, view.archiving) == (2, 2, 1)
    assert view.available == 5  # 5..9


def test_an_extend_to_the_same_deadline_expires_once() -> None:
    sp = make(end=1, config=ShareConfig(lock_ms=1000, max_deliveries=1))
    d = sp.acquire("a", 1, 0).value[0]
    sp.extend(d.receipt, 500, 500)  # the same deadline, 1000: two equal lock entries
    sp.tick(1000)
    assert sp.take_dead_letters() == [DeadLetter(0, 1, "max deliveries")]
    assert sp.take_dead_letters() == []


# --------------------------------------------------------------------------- runs (the wire's form)


def test_acquire_runs_gives_ranges_with_count_and_deadline() -> None:
    sp = make(end=10)
    sp.defer(3, 4, until_ms=500)  # offset 3 waits: the fresh offsets around it form two runs
    r = sp.acquire_runs("a", 6, 100)
    assert r.value == [(0, 3, 1, 1100), (4, 7, 1, 1100)]
    sp.release(Receipt("a", 1, 1), 200)  # comes back with count 2, ahead of fresh offsets
    r = sp.acquire_runs("b", 3, 600)  # 3 is due by now: a delayed record never delivered
    assert r.value == [(1, 2, 2, 1600), (3, 4, 1, 1600), (7, 8, 1, 1600)]
    # Locks registered per run still expire offset by offset.
    sp.ack(Receipt("a", 0, 1), 700)
    sp.tick(1100)
    assert offsets(sp.acquire("c", 10, 1100)) == [2, 4, 5, 6, 8, 9]


def test_settle_runs_checks_each_offset_and_reports_failures_per_run() -> None:
    sp = make(end=10)
    sp.acquire("a", 4, 0)  # 0..3
    sp.acquire("b", 2, 0)  # 4, 5
    r = sp.settle_runs("a", [(0, 3, 1, "ack", 0), (2, 3, 1, "ack", 0)], 10)
    failed = [[o for o, e in run] for run in r.value]
    # 2 was settled by the first run; 4 is b's; 5 is b's too
    assert failed == [[], [2, 4]]
    assert all(isinstance(e, ReceiptExpiredError) for run in r.value for _o, e in run)
    assert sp.start == 4  # 0..3 acked (3 by the second run)
    wrong = sp.settle_runs("b", [(4, 2, 2, "ack", 0)], 10)  # not their delivery count
    assert [o for o, _e in wrong.value[0]] == [4, 5]
    assert sp.settle_runs("b", [(4, 2, 1, "ack", 0)], 10).value == [[]]
    assert sp.start == 6


def test_settle_runs_with_other_kinds_applies_items_in_order() -> None:
    sp = make(end=10)
    sp.acquire("a", 3, 0)  # 0, 1, 2
    runs = [(0, 2, 1, "release", 0), (2, 1, 1, "extend", 5000), (2, 1, 1, "ack", 0)]
    r = sp.settle_runs("a", runs, 10)
    assert r.value == [[], [], []]
    assert sp.start == 0  # 0 and 1 are available again, 2 acked
    assert offsets(sp.acquire("b", 5, 20)) == [0, 1, 3, 4, 5]
    assert [d.delivery_count for d in sp.acquire("c", 2, 20).value] == [1, 1]
