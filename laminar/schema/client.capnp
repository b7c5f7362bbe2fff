@0xbb5f3b4139000a7c;
# laminar client protocol, version 1.
#
# Every message travels in one laminar frame (see laminar/framing.py): the 16-byte header, this
# Cap'n Proto message (unpacked), then a raw payload. Record batches are never inside the Cap'n
# Proto message: a message names them by (payloadOffset, payloadLength) into the frame payload.
# Frame kind 1 carries a Request, kind 2 a Response. A client may pipeline requests; responses
# carry the request's correlationId and may come back in any order.

struct Error {
  # code 0 means success; other codes are the classes in laminar/errors.py.
  code @0 :UInt16;
  message @1 :Text;
  leaderId @2 :UInt32;        # NotLeader: the known leader (0 = unknown)
  leaderAddress @3 :Text;     # NotLeader: its client address host:port
  logStart @4 :Int64;         # OffsetOutOfRange: the log's start offset
  logEnd @5 :Int64;           # OffsetOutOfRange: the log's end offset
}

struct Request {
  correlationId @0 :UInt64;
  apiVersion @1 :UInt16;      # 1
  body :union {
    metadata @2 :MetadataRequest;
    createTopic @3 :TopicSpec;
    deleteTopic @4 :Text;
    produce @5 :ProduceRequest;
    fetch @6 :FetchRequest;
    listOffsets @7 :ListOffsetsRequest;
    clusterStatus @8 :Void;
    drainNode @9 :UInt32;     # move every replica off this node (decommission)
    # Consumer groups: sent to the group's coordinator, the leader of partition
    # crc32c(group) % N of the internal topic __consumer_offsets (any node creates that topic
    # on first use); another node answers NotLeader naming it.
    groupHeartbeat @10 :GroupHeartbeatRequest;
    leaveGroup @11 :LeaveGroupRequest;
    commitOffsets @12 :CommitOffsetsRequest;
    fetchOffsets @13 :FetchOffsetsRequest;
    listGroups @14 :Void;     # sent to every node: each answers the groups it coordinates
    describeGroup @15 :Text;
    deleteGroup @16 :Text;    # only a group with no members; its offsets go with it
    # Share groups (queues): sent to the leader of each partition, like fetch.
    shareFetch @17 :ShareFetchRequest;
    describeQueue @18 :DescribeQueueRequest;
    addPartitions @19 :AddPartitionsRequest;
    alterTopic @20 :AlterTopicRequest;
    undrainNode @21 :UInt32;  # a drained node takes replicas again
    # A share group's settings, stored cluster-wide in the metadata: any node answers.
    alterQueueConfig @22 :AlterQueueConfigRequest;
    describeQueueConfig @23 :Text;  # the group
    # Key-range topics (laminar/splits): answered once the operation finished (or after 20 s
    # with it still open, as the topic's ``operation`` shows).
    splitPartition @24 :SplitPartitionRequest;
    mergePartitions @25 :MergePartitionsRequest;
    # Authentication and authorization (laminar/auth). Once the cluster has a user, a
    # connection's first requests are a SCRAM-SHA-256 exchange: saslAuthenticate with the
    # client-first message, then with the client-final one; anything else is refused with
    # AuthenticationError until it succeeds. User and ACL management need a superuser.
    saslAuthenticate @26 :SaslRequest;
    createUser @27 :UserCredential;
    alterUser @28 :UserCredential;   # a new password (credential); superuser unchanged
    deleteUser @29 :Text;
    listUsers @30 :Void;
    addAcl @31 :AclRule;
    removeAcl @32 :AclRule;
    listAcls @33 :Void;
    clusterHealth @34 :Void;  # counts, not rows: cheap enough to poll during a rolling restart
  }
}

struct Response {
  correlationId @0 :UInt64;
  error @1 :Error;            # request-level error; per-partition errors sit in the body
  body :union {
    none @2 :Void;
    metadata @3 :Metadata;
    topic @4 :TopicInfo;
    produce @5 :ProduceResponse;
    fetch @6 :FetchResponse;
    listOffsets @7 :ListOffsetsResponse;
    clusterStatus @8 :ClusterStatus;
    groupHeartbeat @9 :GroupHeartbeatResponse;
    offsets @10 :CommittedOffsets;
    groups @11 :GroupList;
    group @12 :GroupDescription;
    shareFetch @13 :ShareFetchResponse;
    queue @14 :QueueDescription;
    queueConfig @15 :QueueConfig;
    sasl @16 :SaslResponse;
    users @17 :UserList;
    acls @18 :AclList;
    clusterHealth @19 :ClusterHealth;
  }
}

struct MetadataRequest {
  topics @0 :List(Text);      # empty: every topic
}

struct TopicSpec {
  name @0 :Text;
  partitions @1 :UInt32;
  replicationFactor @2 :UInt16;
  segmentBytes @3 :Int64;     # 0: node default
  segmentMs @4 :Int64;        # 0: node default
  retentionMs @5 :Int64;      # 0: node default, -1: keep forever
  retentionBytes @6 :Int64;   # 0: no size limit
  partitioning @7 :Text;      # "hash" (or empty: fixed partitions) or "range" (split/merge)
  # Range topics: automatic splits and merges (0: off), rates in bytes/s over a window.
  autoSplitAbove @8 :Int64;
  autoMergeBelow @9 :Int64;
  autoWindowMs @10 :Int64;    # 0: 60 s
  maxPartitions @11 :UInt32;  # active partitions at most (0: 64)
}

struct SplitPartitionRequest {
  name @0 :Text;
  partition @1 :UInt32;
  at @2 :Int64 = -1;          # the split point in the key-hash space; -1: the range's middle
}

struct MergePartitionsRequest {
  name @0 :Text;
  first @1 :UInt32;
  second @2 :UInt32;          # active, with a range adjacent to the first's
}

struct TopicOperation {
  # A split or merge in progress: parents are being sealed, children not yet active.
  topic @0 :Text;
  kind @1 :Text;              # split or merge
  parents @2 :List(UInt32);
  children @3 :List(UInt32);
}

struct AddPartitionsRequest {
  # Grow a topic; existing partitions keep their data, keys hash over the new count.
  name @0 :Text;
  total @1 :UInt32;           # the partition count afterwards
}

struct AlterTopicRequest {
  # Change a topic's log settings at run time; -2 keeps a setting as it is.
  name @0 :Text;
  segmentBytes @1 :Int64 = -2;
  segmentMs @2 :Int64 = -2;
  retentionMs @3 :Int64 = -2;     # -1: keep forever
  retentionBytes @4 :Int64 = -2;  # -1: no size limit
  # Range topics' automatic policy (0 turns a threshold off; -2 keeps it).
  autoSplitAbove @5 :Int64 = -2;
  autoMergeBelow @6 :Int64 = -2;
  autoWindowMs @7 :Int64 = -2;
  maxPartitions @8 :Int64 = -2;
}

struct Broker {
  nodeId @0 :UInt32;
  address @1 :Text;           # client address host:port
}

struct PartitionInfo {
  partition @0 :UInt32;
  leader @1 :UInt32;          # 0: no leader known
  replicas @2 :List(UInt32);
  # Key-range topics only (rangeStart -1 otherwise): the key-hash range [rangeStart, rangeEnd)
  # of crc32c(key), the lineage and the seal.
  rangeStart @3 :Int64 = -1;
  rangeEnd @4 :Int64 = -1;
  state @5 :Text;             # active, pending (a child being created) or sealed
  parents @6 :List(UInt32);   # split or merged from these
  sealEnd @7 :Int64 = -1;     # sealed: every record lies below this offset
}

struct TopicInfo {
  spec @0 :TopicSpec;
  topicId @1 :UInt32;
  partitions @2 :List(PartitionInfo);
  operations @3 :List(TopicOperation);  # the split or merge in progress (at most one)
}

struct Metadata {
  brokers @0 :List(Broker);
  topics @1 :List(TopicInfo);
  metadataLeader @2 :UInt32;
  missing @3 :List(Text);     # requested topics that do not exist
}

struct ProduceRequest {
  acks @0 :Int8;              # -1 all (majority on disk), 1 leader (written), 0 none (no reply)
  timeoutMs @1 :UInt32;
  batches @2 :List(BatchRef);
}

struct BatchRef {
  topic @0 :Text;
  partition @1 :UInt32;
  payloadOffset @2 :UInt32;
  payloadLength @3 :UInt32;
}

struct ProduceResult {
  topic @0 :Text;
  partition @1 :UInt32;
  error @2 :Error;
  baseOffset @3 :Int64;
  lastOffset @4 :Int64;
}

struct ProduceResponse {
  results @0 :List(ProduceResult);
}

struct FetchPartition {
  topic @0 :Text;
  partition @1 :UInt32;
  offset @2 :Int64;
  maxBytes @3 :UInt32;
}

struct FetchRequest {
  maxWaitMs @0 :UInt32;       # long poll: wait up to this long for data past each offset
  minBytes @1 :UInt32;
  maxBytes @2 :UInt32;
  partitions @3 :List(FetchPartition);
}

struct FetchResult {
  topic @0 :Text;
  partition @1 :UInt32;
  error @2 :Error;
  highWatermark @3 :Int64;    # committed end: offsets below it are readable
  logStart @4 :Int64;
  payloadOffset @5 :UInt32;   # whole record batches in the frame payload
  payloadLength @6 :UInt32;
}

struct FetchResponse {
  results @0 :List(FetchResult);
}

struct OffsetQuery {
  topic @0 :Text;
  partition @1 :UInt32;
  timestamp @2 :Int64;        # -2 earliest, -1 latest (committed end), else ms since epoch
}

struct ListOffsetsRequest {
  queries @0 :List(OffsetQuery);
}

struct OffsetAnswer {
  topic @0 :Text;
  partition @1 :UInt32;
  error @2 :Error;
  offset @3 :Int64;           # -1: no record at or after the timestamp
}

struct ListOffsetsResponse {
  answers @0 :List(OffsetAnswer);
}

struct MemberStatus {
  nodeId @0 :UInt32;
  address @1 :Text;
  state @2 :Text;             # alive, suspect, dead, left
  incarnation @3 :UInt64;
  metadataVoter @4 :Bool;
  replicas @5 :UInt32;
  leaders @6 :UInt32;
}

struct ReplicaStatus {
  nodeId @0 :UInt32;
  matchOffset @1 :Int64;      # last offset known replicated (-1 none)
  lag @2 :Int64;              # leader's end offset minus replica's end
}

struct PartitionStatus {
  topic @0 :Text;
  partition @1 :UInt32;
  leader @2 :UInt32;
  term @3 :UInt64;
  startOffset @4 :Int64;
  highWatermark @5 :Int64;
  endOffset @6 :Int64;
  replicas @7 :List(ReplicaStatus);
}

struct Move {
  topic @0 :Text;
  partition @1 :UInt32;
  fromNode @2 :UInt32;
  toNode @3 :UInt32;
  stage @4 :Text;
}

struct ReplicaFault {
  topic @0 :Text;
  partition @1 :UInt32;
  nodeId @2 :UInt32;
  state @3 :Text;             # offline, reopening, lost state: re-admitting (...)
  error @4 :Text;             # the fault that took it offline
}

struct MetadataLogStatus {       # one node's copy of the metadata log (metadata_checkpoint.py)
  nodeId @0 :UInt32;
  startOffset @1 :Int64;         # a checkpoint's offset once the log was cut, else 0
  endOffset @2 :Int64;
  checkpoint @3 :Int64;          # the newest checkpoint this node applied (-1: none)
  applied @4 :Int64;             # the last metadata offset this node applied
  sizeBytes @5 :UInt64;
}

struct ClusterStatus {
  members @0 :List(MemberStatus);
  partitions @1 :List(PartitionStatus);
  metadataLeader @2 :UInt32;
  moves @3 :List(Move);
  faults @4 :List(ReplicaFault);  # replicas not serving: offline after a fault, or lost state
  metadataLog @5 :List(MetadataLogStatus);
  operations @6 :List(TopicOperation);  # splits and merges in progress
}

struct NodeCount {
  nodeId @0 :UInt32;
  count @1 :UInt32;
}

struct PartitionRef {
  topic @0 :Text;
  partition @1 :UInt32;
}

struct ClusterHealth {
  # laminar/node/health.py: healthy when every registered node is up and answered, every
  # partition has a leader and all its replicas in sync, and every replica serves. Lists of
  # partitions name at most 20; the counts are exact.
  healthy @0 :Bool;
  reasons @1 :List(Text);              # why not, e.g. "nodes down", "leaderless partitions"
  metadataLeader @2 :UInt32;           # 0: none known
  nodes @3 :List(UInt32);              # registered nodes
  nodesDown @4 :List(UInt32);          # registered, and neither gossip nor a connection says alive
  nodesNotAnswering @5 :List(UInt32);  # alive but silent: what they lead counts as leaderless
  partitions @6 :UInt32;               # partitions that should have a leader
  leaderlessCount @7 :UInt32;
  leaderless @8 :List(PartitionRef);
  underReplicatedCount @9 :UInt32;     # a replica not in sync, or short of the factor
  underReplicated @10 :List(PartitionRef);
  outOfSync @11 :List(NodeCount);      # per node: its replicas not in sync with their leader
  replicaFaultsCount @12 :UInt32;      # replicas not serving (as in ClusterStatus.faults)
  replicaFaults @13 :List(ReplicaFault);
}

# ---------------------------------------------------------------------------- consumer groups
# See laminar/groups/coordinator.py for the protocol (KIP-848 style: the coordinator computes
# assignments; a member only ever gives up what it is told to and is given a partition only
# once nobody else owns it; member epochs fence zombies).

struct GroupPartition {
  topic @0 :Text;
  partition @1 :UInt32;
}

struct GroupHeartbeatRequest {
  group @0 :Text;
  memberId @1 :Text;          # chosen by the client, new for every incarnation
  memberEpoch @2 :Int32;      # 0 joins; afterwards the epoch of the last reply
  instanceId @3 :Text;        # static membership (KIP-345); empty: dynamic member
  rack @4 :Text;
  rebalanceTimeoutMs @5 :UInt32;
  topics @6 :List(Text);      # subscribed topics
  owned @7 :List(GroupPartition);  # partitions the member still owns
}

struct GroupHeartbeatResponse {
  memberId @0 :Text;
  memberEpoch @1 :Int32;
  heartbeatIntervalMs @2 :UInt32;
  sessionTimeoutMs @3 :UInt32;
  assignment @4 :List(GroupPartition);  # what the member may own now; drop anything else
}

struct LeaveGroupRequest {
  group @0 :Text;
  memberId @1 :Text;
  memberEpoch @2 :Int32;
  keepAssignment @3 :Bool;    # a static member leaving for a restart: keep its partitions
}

struct CommittedOffset {
  topic @0 :Text;
  partition @1 :UInt32;
  offset @2 :Int64;           # the next offset to read
  metadata @3 :Text;
  commitMs @4 :Int64;         # replies only
}

struct CommitOffsetsRequest {
  group @0 :Text;
  memberId @1 :Text;          # "" with memberEpoch -1: from outside the group (admin, Spark),
  memberEpoch @2 :Int32;      # only while the group has no members
  offsets @3 :List(CommittedOffset);
}

struct FetchOffsetsRequest {
  group @0 :Text;
  partitions @1 :List(GroupPartition);  # empty: every committed offset of the group
}

struct CommittedOffsets {
  offsets @0 :List(CommittedOffset);
}

struct GroupSummary {
  group @0 :Text;
  state @1 :Text;             # empty, reconciling, stable; classic: also preparing-rebalance,
                              # completing-rebalance
  members @2 :UInt32;
  coordinator @3 :UInt32;
  protocol @4 :Text;          # consumer (laminar's own, KIP-848) or classic (Kafka JoinGroup)
}

struct GroupList {
  groups @0 :List(GroupSummary);
}

struct GroupMember {
  memberId @0 :Text;
  instanceId @1 :Text;
  rack @2 :Text;
  memberEpoch @3 :Int32;
  topics @4 :List(Text);
  assigned @5 :List(GroupPartition);   # owned now
  revoking @6 :List(GroupPartition);   # still to be given up
  target @7 :List(GroupPartition);     # where the group is heading
  fenced @8 :Bool;
}

struct GroupDescription {
  group @0 :Text;
  state @1 :Text;
  epoch @2 :Int32;
  coordinator @3 :UInt32;
  members @4 :List(GroupMember);
  offsets @5 :List(CommittedOffset);
  protocol @6 :Text;          # consumer or classic; a classic group's epoch is its generation
}

# ---------------------------------------------------------------------------- share groups
# A share group reads a topic as a queue: any number of members read the same partition, each
# record is acquired by one member at a time with a lock (visibility timeout) and settled on its
# own. The state lives on the partition's leader and is written to the partition's own Raft log
# as control batches (laminar/queues). See the README's queue table for the semantics.

struct ShareAck {
  topic @0 :Text;
  partition @1 :UInt32;
  offset @2 :Int64;
  deliveryCount @3 :UInt32;   # with the fetch's memberId: the receipt being settled
  action @4 :UInt8;           # 0 ack, 1 release, 2 reject (to the dead-letter topic), 3 extend
  ms @5 :UInt32;              # release: delay before the next delivery; extend: the new lock
}

struct ShareAckRun {
  # ``count`` settlements of consecutive offsets from ``offset`` with the same receipt delivery
  # count, action and ms, in offset order: ShareAcks compressed (a member acks what it was
  # handed, mostly consecutive offsets), so neither side builds or reads one struct per offset.
  topic @0 :Text;
  partition @1 :UInt32;
  offset @2 :Int64;
  count @3 :UInt32;
  deliveryCount @4 :UInt32;
  action @5 :UInt8;
  ms @6 :UInt32;
}

struct ShareAckFailure {
  offset @0 :Int64;
  error @1 :Error;
}

struct ShareAckRunResult {
  error @0 :Error;                   # set: every offset of the run failed with it
  failed @1 :List(ShareAckFailure);  # else these offsets failed and the others are settled
}

struct ShareFetchRequest {
  group @0 :Text;
  memberId @1 :Text;
  partitions @2 :List(GroupPartition);  # acquire from these (this node leads them)
  maxRecords @3 :UInt32;      # 0: only settle the acks
  lockMs @4 :UInt32;          # 0: the group's lock (its lock_ms setting, 30 s by default)
  maxWaitMs @5 :UInt32;       # long poll while nothing is available
  acks @6 :List(ShareAck);    # settled before anything is acquired
  fromEarliest @7 :Bool;      # a group new on a partition starts at its start (default: end)
  ackRuns @8 :List(ShareAckRun);  # settled after ``acks``, in this order
  acquiredRuns @9 :Bool;      # answer with SharePartitionResult.acquiredRuns, not .acquired
  # No byte limit: the reply holds every batch with an acquired record (an acquired record the
  # member never saw would only come back when its lock ran out); maxRecords bounds it.
}

struct ShareAckResult {
  topic @0 :Text;
  partition @1 :UInt32;
  offset @2 :Int64;
  error @3 :Error;            # ReceiptExpired: the lock ran out or the record went elsewhere
}

struct ShareAcquired {
  offset @0 :Int64;
  deliveryCount @1 :UInt32;
  lockUntilMs @2 :Int64;
}

struct ShareAcquiredRun {
  # ``count`` consecutive offsets from ``offset`` acquired alike (one struct per offset costs
  # both sides more than the rest of a share fetch).
  offset @0 :Int64;
  count @1 :UInt32;
  deliveryCount @2 :UInt32;
  lockUntilMs @3 :Int64;
}

struct SharePartitionResult {
  topic @0 :Text;
  partition @1 :UInt32;
  error @2 :Error;
  acquired @3 :List(ShareAcquired);
  payloadOffset @4 :UInt32;   # whole record batches holding the acquired offsets (and others:
  payloadLength @5 :UInt32;   # deliver only the acquired ones)
  acquiredRuns @6 :List(ShareAcquiredRun);  # instead of ``acquired`` if the request asked
  lockMs @7 :UInt32;          # the lock these acquisitions got (the request's, else the group's)
}

struct ShareFetchResponse {
  results @0 :List(SharePartitionResult);
  ackResults @1 :List(ShareAckResult);  # one per ack, in request order
  ackRunResults @2 :List(ShareAckRunResult);  # one per ack run, in request order
}

struct DescribeQueueRequest {
  group @0 :Text;
  partitions @1 :List(GroupPartition);
}

struct QueuePartition {
  topic @0 :Text;
  partition @1 :UInt32;
  error @2 :Error;
  start @3 :Int64;            # every offset below is done (acked, skipped or dead-lettered)
  end @4 :Int64;              # the partition's end as far as the queue has looked
  available @5 :UInt32;
  acquired @6 :UInt32;
  delayed @7 :UInt32;
  deadLettering @8 :UInt32;   # rejected or over max deliveries, being copied aside
  oldestUnackedMs @9 :Int64;  # age of the oldest record not done (0: none)
}

struct QueueDescription {
  partitions @0 :List(QueuePartition);
}

struct QueueConfigEntry {
  # One setting of a share group (laminar/queues/config.py): lock_ms, max_deliveries,
  # dead_letter_topic. Values travel as text (numbers in decimal), as Kafka's configs do.
  name @0 :Text;
  value @1 :Text;
  isDefault @2 :Bool;         # replies: not set for the group, the node default applies
}

struct AlterQueueConfigRequest {
  group @0 :Text;
  entries @1 :List(QueueConfigEntry);  # set these (isDefault ignored)
  reset @2 :List(Text);       # back to the default; a name may not be both set and reset
}

struct QueueConfig {
  group @0 :Text;
  entries @1 :List(QueueConfigEntry);  # every setting, with the value the group runs with
}

# ------------------------------------------------------------------ users and ACLs (laminar/auth)

struct SaslRequest {
  mechanism @0 :Text;         # SCRAM-SHA-256 (the only one)
  token @1 :Data;             # client-first, then client-final message (RFC 5802)
}

struct SaslResponse {
  token @0 :Data;             # server-first, then server-final message
  done @1 :Bool;              # authenticated: verify the server-final message
}

struct UserCredential {
  # A SCRAM-SHA-256 credential made by the client (laminar.auth.scram.make_credential): the
  # password never leaves it.
  name @0 :Text;
  salt @1 :Data;
  iterations @2 :UInt32;      # at least 4096
  storedKey @3 :Data;
  serverKey @4 :Data;
  superuser @5 :Bool;         # createUser only
}

struct UserInfo {
  name @0 :Text;
  superuser @1 :Bool;
  iterations @2 :UInt32;
}

struct UserList {
  users @0 :List(UserInfo);
}

struct AclRule {
  principal @0 :Text;         # a user name, or * for every user
  kind @1 :Text;              # topic, prefix or any
  name @2 :Text;              # the topic or prefix ("" for any)
  operation @3 :Text;         # produce, consume or admin
}

struct AclList {
  rules @0 :List(AclRule);
}
