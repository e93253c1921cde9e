"""``NsqDataSource``: the ``nsq`` format of ``spark.readStream`` (the source), ``df.write`` and
``df.writeStream`` (the sink, ``spark_connector.sink``).

Spark instantiates the data source in several processes; ``__init__`` (Spark's) and
``streamReader`` only parse options, so a bad option fails ``load()`` at once and nothing is
started until the source runner's first driver call (see ``stream_reader``).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from .options import SinkOptions, SourceOptions
from .sink import NsqStreamWriter, NsqWriter, check_schema
from .stream_reader import SCHEMA, NsqStreamReader

__all__ = ["NsqDataSource"]


class NsqDataSource(DataSource):
    """Reads an NSQ channel as a stream of rows ``id, body, timestamp, attempts, nsqd, topic,
    channel`` (options: ``spark_connector.options``); publishes rows ``body[, topic][, deferMs]``
    (options: ``spark_connector.sink``)."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> StructType:
        SourceOptions.parse(self.options)  # fail load() early on bad options
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in SCHEMA.fields]:
            raise ValueError(f"nsq source: the schema is fixed ({SCHEMA.simpleString()}); got {schema.simpleString()}")
        return NsqStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError('nsq sink: a topic cannot be overwritten; use mode("append")')
        options = SinkOptions.parse(self.options)
        return NsqWriter(options, check_schema(schema, options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = SinkOptions.parse(self.options)
        return NsqStreamWriter(options, check_schema(schema, options))
