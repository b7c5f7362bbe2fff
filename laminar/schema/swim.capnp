@0xd1890fe64cb09523;
# SWIM gossip membership messages: one SwimMessage per UDP datagram, inside a laminar frame.

enum MemberState {
  alive @0;
  suspect @1;
  dead @2;
  left @3;
}

struct MetaEntry {
  key @0 :Text;
  value @1 :Text;
}

# What one member believes about one node; piggy-backed on probes and carried in full syncs.
struct Update {
  nodeId @0 :UInt64;
  address @1 :Text;
  incarnation @2 :UInt64;
  state @3 :MemberState;
  meta @4 :List(MetaEntry);
  # The member that reported this (the accuser, for suspect); 0 when not known.
  fromId @5 :UInt64;
}

struct Ping {
  seq @0 :UInt64;
  targetId @1 :UInt64;
}

struct Ack {
  seq @0 :UInt64;
}

# Sent by a ping-req helper whose ping of the target got no ack in time: the requester learns
# that its own link to the helper works (Lifeguard's local health awareness).
struct Nack {
  seq @0 :UInt64;
}

struct PingReq {
  seq @0 :UInt64;
  targetId @1 :UInt64;
  targetAddress @2 :Text;
}

struct Sync {
  # Full state of the sender (possibly one chunk of several).
  members @0 :List(Update);
  wantReply @1 :Bool;
}

struct SwimMessage {
  sourceId @0 :UInt64;
  updates @1 :List(Update);
  body :union {
    ping @2 :Ping;
    ack @3 :Ack;
    pingReq @4 :PingReq;
    sync @5 :Sync;
    gossip @6 :Void;
    nack @7 :Nack;
  }
}
