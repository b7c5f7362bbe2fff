"""Hostile but well-formed messages never break the core: no exception, and what it sends encodes.

Messages are drawn so they name the member under test and a few known peers (ids 1-4) often,
with arbitrary incarnations, states, sequence numbers and addresses, as a buggy or malicious
peer could send them after they pass the codec.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar.membership import codec
from laminar.membership.messages import Ack, Gossip, Message, Ping, PingReq, Sync, Update
from laminar.membership.state import MAX_INCARNATION
from laminar.membership.swim import MemberState, Swim, SwimConfig

ME = 1
ids = st.one_of(st.sampled_from([ME, 2, 3, 4]), st.integers(min_value=1, max_value=2**64 - 1))
incarnations = st.one_of(
    st.integers(min_value=0, max_value=5), st.integers(min_value=0, max_value=MAX_INCARNATION)
)
addresses = st.sampled_from(["10.0.0.1:7946", "10.0.0.2:7946", "", "nohost", "[::1]:1", "a:b"])
updates = st.lists(
    st.builds(
        Update,
        node_id=ids,
        address=addresses,
        incarnation=incarnations,
        state=st.sampled_from(list(MemberState)),
        meta=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
        from_id=st.one_of(st.just(0), ids),
    ),
    max_size=6,
).map(tuple)
seqs = st.integers(min_value=0, max_value=2**64 - 1)
messages = st.one_of(
    st.builds(
        Ping, source_id=ids, seq=seqs, target_id=st.one_of(st.just(ME), ids), updates=updates
    ),
    st.builds(Ack, source_id=ids, seq=st.one_of(st.integers(0, 40), seqs), updates=updates),
    st.builds(
        PingReq, source_id=ids, seq=seqs, target_id=ids, target_address=addresses, updates=updates
    ),
    st.builds(Sync, source_id=ids, members=updates, want_reply=st.booleans(), updates=updates),
    st.builds(Gossip, source_id=ids, updates=updates),
)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(messages, st.integers(min_value=0, max_value=12)), max_size=15))
def test_core_survives_arbitrary_messages(script: list[tuple[Message, int]]) -> None:
    swim = Swim(ME, "10.0.0.1:7946", {"raft": "r"}, SwimConfig(seed=3), ["10.0.0.2:7946"])
    for message, ticks in script:
        swim.receive("10.0.0.9:7946", message)
        for _ in range(ticks):
            swim.tick()
        for _, out in swim.outbox():
            assert codec.decode(codec.encode(out)) == out
        swim.events()
    me = swim.member(ME)
    assert me is not None and me.state is MemberState.ALIVE  # never talked into its own death
    assert me.incarnation <= MAX_INCARNATION
