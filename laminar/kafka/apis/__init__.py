"""The registry of served Kafka APIs: api key -> ``Api`` (schemas, versions, handler).

One module per API, each exporting ``API``. To add an API, write its module and list it in
``MODULES``; ApiVersions advertises exactly what is here.
"""

from __future__ import annotations

from laminar.kafka.api import Api
from laminar.kafka.apis import (
    acls,
    api_versions,
    consumer_group_describe,
    consumer_group_heartbeat,
    create_partitions,
    create_topics,
    delete_groups,
    delete_topics,
    describe_configs,
    describe_groups,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    metadata,
    offset_commit,
    offset_fetch,
    produce,
    sasl_authenticate,
    sasl_handshake,
    sync_group,
    user_scram_credentials,
)

MODULES = [
    produce,
    fetch,
    list_offsets,
    metadata,
    api_versions,
    create_topics,
    create_partitions,
    delete_topics,
    describe_configs,
    incremental_alter_configs,
    init_producer_id,
    # consumer groups (classic protocol and offsets)
    find_coordinator,
    join_group,
    sync_group,
    heartbeat,
    leave_group,
    offset_commit,
    offset_fetch,
    list_groups,
    describe_groups,
    delete_groups,
    consumer_group_heartbeat,
    consumer_group_describe,
    # SASL/SCRAM-SHA-256 (laminar/auth)
    sasl_handshake,
    sasl_authenticate,
]

SERVED: dict[int, Api] = {}


def register(api: Api) -> None:
    """Serve ``api`` (also for APIs defined outside this package)."""
    SERVED[api.key] = api


for _module in MODULES:
    register(_module.API)
register(user_scram_credentials.DESCRIBE_API)
register(acls.DESCRIBE_API)
register(acls.CREATE_API)
register(acls.DELETE_API)
register(user_scram_credentials.ALTER_API)
