@0xd256324a2adcf7bd;
# laminar node-to-node protocol (frame kind 3), version 1.
#
# One TCP connection per ordered pair of nodes carries Raft traffic of every group. All of a
# flush cycle's messages to one peer go in one frame; entry data (record batches) travel in the
# frame payload, consecutively, in the order of the entry headers.

struct Hello {
  nodeId @0 :UInt32;
  clusterId @1 :Text;
  address @2 :Text;           # the sender's peer address host:port
  clientAddress @3 :Text;     # the sender's client address host:port
}

struct EntryHeader {
  term @0 :UInt64;
  index @1 :Int64;
  last @2 :Int64;
  kind @3 :UInt8;
  dataLength @4 :UInt32;
}

struct RaftMessage {
  group @0 :UInt64;           # 0: the metadata group; else topicId << 20 | partition
  type @1 :UInt8;
  to @2 :UInt32;
  from @3 :UInt32;
  term @4 :UInt64;
  logTerm @5 :UInt64;
  index @6 :Int64;
  commit @7 :Int64;
  reject @8 :Bool;
  rejectHint @9 :Int64;
  context @10 :Data;
  entries @11 :List(EntryHeader);
  extra @12 :Int64;           # type-specific integer (e.g. a reset's previous term)
}

struct PeerMessage {
  union {
    hello @0 :Hello;
    raft @1 :List(RaftMessage);
  }
}
