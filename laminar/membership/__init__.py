"""SWIM gossip membership: a sans-I/O core (swim), its wire codec, and an asyncio UDP driver."""

from laminar.membership.state import EventKind, Member, MemberEvent, MemberState

__all__ = ["EventKind", "Member", "MemberEvent", "MemberState"]
