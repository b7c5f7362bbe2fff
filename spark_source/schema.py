"""The row schema, identical to Spark's Kafka source so existing queries port unchanged.

Like the Kafka source, every field is declared nullable (only key, value and header values are
ever null in practice).

Spark checks a Python source's Arrow batches against ``to_arrow_schema(schema, "UTC")`` with
``Schema.equals``, so the Arrow schema is derived from the Spark one here, in one place.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# Kafka's timestampType: 0 = CreateTime (set by the producer); laminar has no LogAppendTime yet.
TIMESTAMP_TYPE_CREATE_TIME = 0

HEADER_TYPE = StructType(
    [StructField("key", StringType(), True), StructField("value", BinaryType(), True)]
)


def spark_schema(include_headers: bool) -> StructType:
    """The Kafka source's row schema, plus ``headers`` when asked for."""
    fields = [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(HEADER_TYPE, True), True))
    return StructType(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for ``schema`` (what read() batches must carry)."""
    return to_arrow_schema(schema, timezone="UTC")
