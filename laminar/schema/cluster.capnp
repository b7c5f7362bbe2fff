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
  quiesce @12 :Bool;          # heartbeat: the leader is idle, stop ticking
}

struct Call {
  # A node-internal request (e.g. a metadata command for the metadata leader), JSON bodies.
  id @0 :UInt64;
  method @1 :Text;
  body @2 :Data;
}

struct Reply {
  id @0 :UInt64;
  errorCode @1 :UInt16;       # 0: success; else a code of laminar/errors.py
  errorMessage @2 :Text;
  body @3 :Data;
}

struct PeerMessage {
  union {
    hello @0 :Hello;
    raft @1 :List(RaftMessage);
    call @2 :Call;
    reply @3 :Reply;
    raftPacked @4 :Data;
    # Raft messages of many groups, struct-packed (laminar/node/raft_codec.py): per message
    # a fixed header (group u64, type u8, to u32, from u32, term u64, logTerm u64, index i64,
    # commit i64, reject u8, rejectHint i64, quiesce u8, context length u32, entry count
    # u32; little-endian), its context, then one EntryHeader-like record per entry (term u64,
    # index i64, last i64, kind u8, dataLength u32). Reading a List(RaftMessage) field by
    # field cost a third of a node's loop at 3,000 partitions; nodes send this form.
  }
}
