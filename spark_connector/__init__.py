"""Read NSQ channels as a Spark Structured Streaming source that loses nothing.

``import spark_connector`` registers the ``nsq`` format with the active SparkSession, if there is
one; ``spark_connector.register(spark)`` (or ``spark.dataSource.register(NsqDataSource)``) does it
for any session. The consumer, the log path's reader, the write-ahead log and the options need ``protocol``,
``trionsq.blocking`` (the project's client on plain sockets; no trio) and the standard library (plus protobuf);
the Spark classes need pyspark and pyarrow.
"""

from .options import SourceOptions as SourceOptions
from .wal import WalCorruptError as WalCorruptError
from .wal import WalError as WalError

try:
    from .datasource import NsqDataSource as NsqDataSource
except ImportError:  # pyspark is not installed: the WAL and consumer stay usable
    NsqDataSource = None  # type: ignore[assignment,misc]


def register(spark) -> None:
    """Make ``spark.readStream.format("nsq")`` available in ``spark``."""
    if NsqDataSource is None:
        raise ImportError("spark_connector needs pyspark>=4.2 and pyarrow: pip install 'trionsq[spark]'")
    spark.dataSource.register(NsqDataSource)


def _register_active_session() -> None:
    if NsqDataSource is None:
        return
    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    except Exception:  # executors and planners have no session: nothing to do
        return
    if spark is not None:
        register(spark)


_register_active_session()
