"""``twophase.spark.data_source(MySink, name="my-sink")``: a user's :class:`~twophase.TwoPhaseCommitSink` as a Spark
format, on the same adapter as the built-in formats (:class:`~twophase.spark.datasource.TwoPhaseSinkDataSource`:
streaming writes through ``streamWriter``, batch writes through ``writer`` and :mod:`twophase.write_job`).

The format's options are the constructor's keyword arguments, as strings: ``.option("directory", "/out")
.option("sink_id", "s1")`` builds ``MySink(directory="/out", sink_id="s1")``. Option names are case-insensitive
(Spark lowercases them) and ``sinkId`` is ``sink_id``. Spark's own options are not passed: ``checkpointLocation``
(the sink's log lives under it unless ``log_location`` is given) and, for batch writes, ``writeId`` and
``batch.abandonAfter`` (:data:`twophase.write_job.WRITE_JOB_OPTIONS`); ``path`` (``.save(path)``) is passed only to
a constructor that takes ``path``. An option the constructor does not take, or a required argument without its
option, is refused on the driver before any data moves, naming it.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, List, Optional

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from twophase._redact import redact_error
from twophase.errors import ConfigurationError
from twophase.sink import Guarantee
from twophase.spark.datasource import TwoPhaseCommitMessage, TwoPhaseSinkDataSource, TwoPhaseStreamWriter
from twophase.user_sink import TwoPhaseCommitSink

#: options Spark (or twophase's adapter) sets itself; never constructor arguments
_SPARK_OPTIONS = frozenset({"checkpointlocation"})
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword parameters of ``cls.__init__`` by normalised name, with those of the ``__init__`` it passes
    ``**kw`` up to (down to the base's ``sink_id``, ``log_location``, ``guarantee``)."""
    params: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        var_kw = False
        for p in list(inspect.signature(init).parameters.values())[1:]:
            if p.kind is p.VAR_KEYWORD:
                var_kw = True
            elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                params.setdefault(_norm(p.name), p)
        if not var_kw or klass is TwoPhaseCommitSink:
            break
    return params


def sink_from_options(sink_class: type, name: str, options: dict[str, str]) -> TwoPhaseCommitSink[Any]:
    """Build ``sink_class(**options)`` (the options matched to its keyword parameters), or a ConfigurationError
    naming the option."""
    params = _parameters(sink_class)
    kwargs: dict[str, Any] = {}
    for key, value in options.items():
        if key.lower() in _SPARK_OPTIONS:
            continue
        p = params.get(_norm(key))
        if p is None:
            if key.lower() == "path":
                raise ConfigurationError(
                    f"{name}: {sink_class.__name__}.__init__ takes no 'path' (given by .save(path) or .option('path', "
                    f"...)): pass the destination as one of its options instead: {', '.join(sorted(_names(params)))}")
            raise ConfigurationError(
                f"{name}: unknown option {key!r}: {sink_class.__name__}.__init__ takes "
                f"{', '.join(sorted(_names(params)))} (each .option(name, value) is one keyword argument, a string)")
        if p.name in kwargs:
            raise ConfigurationError(f"{name}: option {key!r} is given twice (as {p.name} and {key})")
        kwargs[p.name] = value
    missing = [p.name for p in params.values() if p.default is p.empty and p.name not in kwargs]
    if missing:
        raise ConfigurationError(
            f"{name}: missing option(s) {', '.join(missing)}: {sink_class.__name__}.__init__ requires them; add "
            + " ".join(f".option({m!r}, ...)" for m in missing))
    try:
        sink = sink_class(**kwargs)
        sink._twophase_options = dict(kwargs)  # a batch write's sink is built again from them (write_job_spec)
    except ConfigurationError as e:  # the constructor's message may echo an option's value: secret ones masked
        raise ConfigurationError(f"{name}: {redact_error(e, kwargs)}") from None
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"{name}: {sink_class.__name__}({', '.join(f'{k}=...' for k in kwargs)}) "
                                 f"refused its options: {type(e).__name__}: {redact_error(e, kwargs)}") from None
    return sink


class _UserStreamWriter(TwoPhaseStreamWriter):
    """The streaming writer of a user's format: a sink's ``completion_guard(batch_id, acks)`` (if it has one) is held
    around completing and committing the batch (twophase-postgres: the fence of its dead-attempt rollback)."""

    def commit(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        guard = getattr(self.sink, "completion_guard", None)
        if guard is None or self.sink.guarantee is Guarantee.AT_LEAST_ONCE:
            return super().commit(messages, batchId)
        with guard(batchId, [m.ack for m in messages if isinstance(m, TwoPhaseCommitMessage)]):
            return super().commit(messages, batchId)


def _names(params: dict[str, inspect.Parameter]) -> list[str]:
    return [p.name for p in params.values()]


def data_source(sink_class: type, name: str) -> type:
    """A PySpark data source class writing to ``sink_class`` (a :class:`~twophase.TwoPhaseCommitSink` subclass) under
    the format name ``name``; register it with ``spark.dataSource.register(...)``."""
    if not (isinstance(sink_class, type) and issubclass(sink_class, TwoPhaseCommitSink)):
        raise ConfigurationError(f"data_source: {sink_class!r} is not a subclass of twophase.TwoPhaseCommitSink")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(f"data_source: the format name must be letters, digits, '_', '.', '-' "
                                 f"(e.g. 'my-sink'), got {name!r}")
    if sink_class.__dict__.get("__abstractmethods__"):
        missing = ", ".join(sorted(sink_class.__abstractmethods__))
        raise ConfigurationError(f"data_source: {sink_class.__name__} does not implement {missing}")
    _parameters(sink_class)  # a signature inspect cannot read fails here, not on the first query

    def build_sink(self: TwoPhaseSinkDataSource, schema: StructType) -> TwoPhaseCommitSink[Any]:
        sink = sink_from_options(sink_class, self.short_name, dict(self.options))
        check = getattr(sink, "check_spark_schema", None)
        if check is not None:  # a sink that refuses columns it cannot write (twophase-postgres)
            check(schema)
        owner = self.options.get("checkpointlocation")
        if owner:
            sink.bind_owner(owner)
        run = getattr(sink, "spark_format_run", None)
        if run is not None:  # twophase-postgres: its tasks roll back the batch's dead attempts of earlier runs
            run()
        return sink

    def streamWriter(self: TwoPhaseSinkDataSource, schema: StructType, overwrite: bool) -> Any:
        return _UserStreamWriter(TwoPhaseSinkDataSource.streamWriter(self, schema, overwrite).sink)

    def writer(self: TwoPhaseSinkDataSource, schema: StructType, overwrite: bool) -> Any:
        if "loglocation" not in {_norm(k) for k in self.options}:
            raise ConfigurationError(
                f"{self.short_name}: a batch write needs a place for its transaction log: add "
                ".option('log_location', '/path/or/s3://bucket/prefix') (kept across runs, reachable from the "
                "driver and the executors, so that a re-run with the same writeId writes nothing)")
        return TwoPhaseSinkDataSource.writer(self, schema, overwrite)

    cls = type(f"{sink_class.__name__}DataSource", (TwoPhaseSinkDataSource,), {
        "__doc__": f"Spark format {name!r}: writes to {sink_class.__module__}.{sink_class.__qualname__}.",
        "__module__": __name__,
        "short_name": name,
        "spec_class": sink_class,
        "build_sink": build_sink,
        "writer": writer,
        "streamWriter": streamWriter,
    })
    return cls
