"""What spark_barrier reads from Spark's JVM through Py4J, and nothing else does.

Inside ``foreachBatch`` the sink needs two facts the Python API does not give it:

- the streaming query running the batch (its ``id``: stable across restarts from one
  checkpoint, new for a new checkpoint), from the local property Spark sets on the
  query's thread, or else the active query named after the job;
- the offsets Spark planned for the batch, per barrier source. The DataFrame handed
  to ``foreachBatch`` is a ``LogicalRDD`` that has lost them, but the query's current
  ``IncrementalExecution`` still holds its plan, whose
  ``StreamingDataSourceV2ScanRelation`` leaves carry ``startOffset``/``endOffset``
  and the source's options.

Reads ask one more fact: whether Spark's Hadoop has a FileSystem for a URI scheme
(:func:`hadoop_reads_scheme`), so that files it cannot open are read another way.

The sink builds its own DataFrames (changelog netting, a CDC batch's last change per
key) as one SQL query over the batch's frames (:func:`sql_over`): pyspark's DataFrame API makes
a Py4J call for every column, literal and operator (two for ``F.col``, one per element
of a list), and a driver running several queries pays each call in milliseconds.

The listener's events cross here too (:class:`JsonQueryEvents`): Spark's Java listener
calls back into Python, and pyspark's own wrapper turns each progress event into
Python field by field, dozens of Py4J calls per event.

Everything here is best read as "what Spark 4.x does today": a change of these
internals raises :class:`PlanUnavailable` with the reason, never a wrong answer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)
from pyspark.sql.types import StructType

# StreamExecution.QUERY_ID_KEY: set on the query's thread, which runs foreachBatch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
_SCAN_RELATION = "StreamingDataSourceV2ScanRelation"


class PlanUnavailable(RuntimeError):
    """Spark's plan of the running batch could not be read."""


@dataclass(frozen=True)
class PlannedScan:
    """One streaming source of a batch as Spark planned it."""

    source: str  # the data source's name, e.g. "metaservice_barrier"
    options: dict[str, str]
    start: dict[str, Any] | None  # the offsets, as the source returned them
    end: dict[str, Any] | None


def running_query_id(spark: SparkSession, query_name: str | None = None) -> str | None:
    """The id of the streaming query whose ``foreachBatch`` call runs on this thread,
    else of the active query named ``query_name``; None when there is none."""
    query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    if query_id:
        return str(query_id)
    if query_name:
        for query in spark.streams.active:
            if query.name == query_name:
                return str(query.id)
    return None


def planned_scans(spark: SparkSession, query_id: str, batch_id: int) -> list[PlannedScan]:
    """The streaming sources of batch ``batch_id`` of query ``query_id``, with the
    offsets Spark planned for them (call it from the query's ``foreachBatch``)."""
    query = spark.streams.get(query_id)
    if query is None:
        raise PlanUnavailable(f"no active streaming query has id {query_id}")
    try:
        execution = query._jsq.streamingQuery().lastExecution()
        if execution is None:
            raise PlanUnavailable(f"query {query_id} has not planned a batch yet")
        planned_batch = int(execution.currentBatchId())
        if planned_batch != batch_id:
            raise PlanUnavailable(
                f"query {query_id} is planning batch {planned_batch}, not batch {batch_id}"
            )
        return [_scan(leaf) for leaf in _leaves(execution.logical()) if _is_scan(leaf)]
    except PlanUnavailable:
        raise
    except Exception as exc:  # Py4J errors: Spark's internals are not what we expect
        raise PlanUnavailable(f"cannot read the plan of query {query_id}: {exc}") from exc


def hadoop_reads_scheme(spark: SparkSession, scheme: str) -> bool:
    """Whether Spark's Hadoop (as configured in ``spark``) has a FileSystem for ``scheme``.

    ``s3`` has none without hadoop-aws on the classpath and ``spark.hadoop.fs.s3.impl``;
    an implementation configured but missing from the classpath counts as none.
    """
    hadoop = spark._jsc.hadoopConfiguration()
    try:
        spark._jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, hadoop)  # type: ignore[union-attr]
    except Exception:  # Py4J: UnsupportedFileSystemException, ClassNotFoundException
        return False
    return True


def sql_over(frames: Mapping[str, DataFrame], query: str) -> DataFrame:
    """``query`` (Spark SQL naming each of ``frames`` by its key in braces, ``{rows}``)
    as a DataFrame, in two Py4J calls plus two a frame whatever its size: each frame is
    a temporary view of a unique name while the query is analysed, as pyspark's
    ``spark.sql(query, rows=df)`` does it (with a few more calls). The DataFrame keeps
    its analysed plan, so dropping the views does not change it. The frames must share
    one session."""
    session = next(iter(frames.values())).sparkSession
    views = {name: f"__ms_{uuid.uuid4().hex}" for name in frames}
    jsession = session._jsparkSession
    try:
        for name, frame in frames.items():
            frame._jdf.createOrReplaceTempView(views[name])
        for name, view in views.items():
            query = query.replace("{" + name + "}", view)
        return DataFrame(jsession.sql(query), session)
    finally:
        catalog = jsession.catalog()
        for view in views.values():
            catalog.dropTempView(view)


def read_parquet(spark: SparkSession, schema: StructType, paths: Sequence[str]) -> DataFrame:
    """``spark.read.schema(schema).parquet(*paths)`` in six Py4J calls whatever the
    number of paths: pyspark's reader looks the active session up first (about eight
    calls) and hands the paths over one call each."""
    jsession = spark._jsparkSession
    jpaths = _json_writer(jsession).readValue(
        json.dumps(list(paths)), _java_class(jsession, "java.util.ArrayList")
    )
    reader = jsession.read().schema(jsession.parseDataType(schema.json()))
    return DataFrame(reader.parquet(_python_utils(jsession).toSeq(jpaths)), spark)


def empty_frame(spark: SparkSession, schema: StructType) -> DataFrame:
    """An empty DataFrame of ``schema`` in four Py4J calls (``spark.createDataFrame([],
    schema)`` makes about thirty)."""
    jsession = spark._jsparkSession
    rows = _json_writer(jsession).readValue("[]", _java_class(jsession, "java.util.ArrayList"))
    return DataFrame(jsession.createDataFrame(rows, jsession.parseDataType(schema.json())), spark)


def quoted(name: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def _leaves(plan: Any) -> list[Any]:
    leaves = []
    iterator = plan.collectLeaves().iterator()
    while iterator.hasNext():
        leaves.append(iterator.next())
    return leaves


def _is_scan(leaf: Any) -> bool:
    return bool(leaf.getClass().getSimpleName() == _SCAN_RELATION)


def _scan(leaf: Any) -> PlannedScan:
    relation = leaf.relation()
    return PlannedScan(
        source=str(relation.table().name()),
        options=_string_map(relation.options().asCaseSensitiveMap()),
        start=_offset(leaf.startOffset()),
        end=_offset(leaf.endOffset()),
    )


def _string_map(jmap: Any) -> dict[str, str]:
    """A ``java.util.Map<String, String>`` as a dict, in one Py4J call: its JSON by the
    Jackson that Spark ships (a Py4J map is walked key by key, three calls a key, and a
    barrier source has about ten options)."""
    try:
        parsed = json.loads(_json_writer(jmap).writeValueAsString(jmap))
    except Exception:  # no Jackson on the JVM's class path: walk the map
        parsed = dict(jmap)
    return {str(k): str(v) for k, v in parsed.items()}


# JVM objects looked up once per Py4J gateway: naming a JVM class through ``_jvm`` costs
# a call per package segment.
_jvm_objects: dict[tuple[int, str], Any] = {}


def _jvm_object(jobject: Any, name: str, make: Any) -> Any:
    key = (id(jobject._gateway_client), name)
    found = _jvm_objects.get(key)
    if found is None:
        from pyspark import SparkContext

        jvm = SparkContext._jvm
        assert jvm is not None, "no SparkContext is running"
        found = _jvm_objects[key] = make(jvm)
    return found


def _json_writer(jobject: Any) -> Any:
    """Jackson's ``ObjectMapper`` (Spark ships it)."""
    return _jvm_object(
        jobject, "ObjectMapper", lambda jvm: jvm.com.fasterxml.jackson.databind.ObjectMapper()
    )


def _java_class(jobject: Any, name: str) -> Any:
    """The ``java.lang.Class`` named ``name``."""
    return _jvm_object(jobject, name, lambda jvm: jvm.java.lang.Class.forName(name))


def _python_utils(jobject: Any) -> Any:
    return _jvm_object(
        jobject, "PythonUtils", lambda jvm: jvm.org.apache.spark.api.python.PythonUtils
    )


def _offset(option: Any) -> dict[str, Any] | None:
    if not option.isDefined():
        return None
    parsed = json.loads(option.get().json())
    return parsed if isinstance(parsed, dict) else {"value": parsed}


class JsonQueryEvents:
    """The Java side of a :class:`StreamingQueryListener` (what pyspark's
    ``JStreamingQueryListener`` is), handing it progress events read from their JSON.

    pyspark's wrapper builds each progress event with a Py4J call per field, key,
    source and metric (about a hundred). Spark's listener bus calls it for every batch
    of every query of the session, on one thread, and those calls share the driver's
    Py4J gateway and the Python interpreter with the batches themselves: with four
    queries at one batch a second the conversion kept a core's worth of the driver
    busy (py-spy: the callback thread was never idle). Here a progress event is one
    call (``progress().json()``) and the rest is Python. Start and termination events
    are rare and still converted by pyspark; idle events are dropped unless the
    listener overrides ``onQueryIdle``.
    """

    def __init__(self, listener: StreamingQueryListener) -> None:
        self.listener = listener
        self._idle = type(listener).onQueryIdle is not StreamingQueryListener.onQueryIdle

    def onQueryStarted(self, jevent: Any) -> None:
        self.listener.onQueryStarted(QueryStartedEvent.fromJObject(jevent))

    def onQueryProgress(self, jevent: Any) -> None:
        progress = json.loads(jevent.progress().json())
        self.listener.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress}))

    def onQueryIdle(self, jevent: Any) -> None:
        if self._idle:
            self.listener.onQueryIdle(QueryIdleEvent.fromJObject(jevent))

    def onQueryTerminated(self, jevent: Any) -> None:
        self.listener.onQueryTerminated(QueryTerminatedEvent.fromJObject(jevent))

    class Java:
        implements: ClassVar[list[str]] = [
            "org.apache.spark.sql.streaming.PythonStreamingQueryListener"
        ]


def java_listener(listener: StreamingQueryListener) -> Any:
    """The JVM object that calls ``listener`` through :class:`JsonQueryEvents` (what
    ``StreamingQueryManager.addListener`` registers: a listener's ``_jlistener``)."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    assert jvm is not None, "no SparkContext is running"
    return jvm.PythonStreamingQueryListenerWrapper(JsonQueryEvents(listener))
