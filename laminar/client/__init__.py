"""The asyncio client library: Producer, Consumer and Admin.

async with Producer("127.0.0.1:9092") as producer:
    metadata = await producer.send_and_wait("demo", b"hello", key=b"k")
"""

from laminar.client.admin import Admin
from laminar.client.cluster import Cluster
from laminar.client.connection import Connection
from laminar.client.consumer import Consumer
from laminar.client.descriptions import (
    ClusterHealth,
    ClusterStatus,
    MemberStatus,
    Move,
    PartitionDescription,
    PartitionStatus,
    ReplicaStatus,
    TopicDescription,
)
from laminar.client.group_member import RebalanceListener
from laminar.client.group_types import (
    CommittedOffset,
    GroupDescription,
    GroupMemberDescription,
    GroupSummary,
    OffsetAndMetadata,
    PartitionLag,
)
from laminar.client.groups import GroupClient
from laminar.client.partitioner import DefaultPartitioner, Partitioner
from laminar.client.producer import Producer
from laminar.client.queue_types import QueueConfig, QueueDescription, QueuePartitionStatus
from laminar.client.share_consumer import ShareConsumer
from laminar.client.share_message import ShareMessage
from laminar.client.types import (
    DEFAULT_BOOTSTRAP,
    DELIVER_AT_HEADER,
    ConsumerRecord,
    FetchedBatches,
    RecordMetadata,
    TopicPartition,
)
from laminar.client.user_admin import Acl, UserDescription

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "DELIVER_AT_HEADER",
    "Acl",
    "Admin",
    "Cluster",
    "ClusterHealth",
    "ClusterStatus",
    "CommittedOffset",
    "Connection",
    "Consumer",
    "ConsumerRecord",
    "DefaultPartitioner",
    "FetchedBatches",
    "GroupClient",
    "GroupDescription",
    "GroupMemberDescription",
    "GroupSummary",
    "MemberStatus",
    "Move",
    "OffsetAndMetadata",
    "PartitionDescription",
    "PartitionLag",
    "PartitionStatus",
    "Partitioner",
    "Producer",
    "QueueConfig",
    "QueueDescription",
    "QueuePartitionStatus",
    "RebalanceListener",
    "RecordMetadata",
    "ReplicaStatus",
    "ShareConsumer",
    "ShareMessage",
    "TopicDescription",
    "TopicPartition",
    "UserDescription",
]
