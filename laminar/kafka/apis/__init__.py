"""The registry of served Kafka APIs: api key -> ``Api`` (schemas, versions, handler).

One module per API, each exporting ``API``. To add an API, write its module and list it in
``MODULES``; ApiVersions advertises exactly what is here.
"""

from __future__ import annotations

from laminar.kafka.api import Api
from laminar.kafka.apis import (
    api_versions,
    create_topics,
    delete_topics,
    describe_configs,
    fetch,
    init_producer_id,
    list_offsets,
    metadata,
    produce,
)

MODULES = [
    produce,
    fetch,
    list_offsets,
    metadata,
    api_versions,
    create_topics,
    delete_topics,
    describe_configs,
    init_producer_id,
]

SERVED: dict[int, Api] = {}


def register(api: Api) -> None:
    """Serve ``api`` (also for APIs defined outside this package)."""
    SERVED[api.key] = api


for _module in MODULES:
    register(_module.API)
