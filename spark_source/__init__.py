"""Spark Structured Streaming source for laminar (PySpark Python Data Source ``laminar``).

from spark_source import register
register(spark)
df = spark.readStream.format("laminar").option("subscribe", "demo").load()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_source.options import OptionError, SourceOptions, parse_options
from spark_source.planning import DataLossError, LaminarInputPartition
from spark_source.source import LaminarBatchReader, LaminarDataSource, LaminarStreamReader

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DataLossError",
    "LaminarBatchReader",
    "LaminarDataSource",
    "LaminarInputPartition",
    "LaminarStreamReader",
    "OptionError",
    "SourceOptions",
    "parse_options",
    "register",
]


def register(spark: SparkSession) -> None:
    """Make format ``laminar`` available in ``spark`` (registration is per session)."""
    spark.dataSource.register(LaminarDataSource)
