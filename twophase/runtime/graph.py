"""The job graph: sources with parallel splits, operators and sinks, wired by partitioned edges.

Build it fluently::

    g = JobGraph("orders")
    a = g.source(CollectionSource(...), uid="a", parallelism=2, watermarks=WatermarkStrategy(ts))
    b = g.source(KafkaSource(...), uid="b")
    (a.union(b).map(parse, uid="parse")
       .key_by(lambda r: r["user"]).map(count_per_user, uid="count")
       .sink_to(FileSink.from_options({...}), uid="out"))

Every vertex has a ``uid``; state in checkpoints and savepoints is stored per uid and subtask, so
give stateful vertices explicit uids if savepoints must survive changes to the graph.

Edges: ``forward`` (subtask i feeds subtask i; equal parallelism), ``rebalance`` (round-robin to all)
and ``hash`` (``key_by``: records with equal keys reach the same subtask). A forward edge between
vertices of different parallelism becomes a rebalance edge.

Invariants (``test_graph_invN_*``):

1. uids are unique in a graph; a graph has at least one source and one sink, and no cycles
   (edges only point to vertices created later).
2. Every record of a hash edge with key k goes to subtask ``stable_hash(k) % parallelism``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Optional

from twophase.errors import ConfigurationError
from twophase.runtime import operators as ops
from twophase.runtime.sources import Source
from twophase.runtime.watermarks import WatermarkStrategy
from twophase.runtime.windows import AggregateFunction, TumblingEventTimeWindowOperator
from twophase.sink import SinkSpec


@dataclass(frozen=True)
class Edge:
    upstream: "Vertex"
    kind: str  # forward | rebalance | hash
    key_fn: Optional[Callable[[Any], Hashable]] = None


@dataclass(eq=False)
class Vertex:
    """One node of the graph; ``parallelism`` subtasks run it."""

    uid: str
    kind: str  # source | operator | sink
    parallelism: int
    inputs: list[Edge] = field(default_factory=list)
    operator_factory: Optional[Callable[[], ops.Operator]] = None
    source: Optional[Source] = None
    watermarks: Optional[WatermarkStrategy] = None
    sink: Optional[SinkSpec] = None
    to_row: Optional[Callable[[Any], dict]] = None

    @property
    def task_ids(self) -> list[str]:
        return [task_id(self.uid, i) for i in range(self.parallelism)]


def task_id(uid: str, subtask: int) -> str:
    return f"{uid}#{subtask}"


def split_task_id(tid: str) -> tuple[str, int]:
    uid, _, sub = tid.rpartition("#")
    return uid, int(sub)


class JobGraph:
    """A streaming job's vertices in creation (topological) order (invariant 1)."""

    def __init__(self, name: str, *, default_parallelism: int = 1) -> None:
        if not name:
            raise ConfigurationError("a job needs a name (it names the job in logs and savepoints)")
        self.name = name
        self.default_parallelism = default_parallelism
        self.vertices: list[Vertex] = []
        self._counter = 0

    def _add(self, vertex: Vertex) -> Vertex:
        if any(v.uid == vertex.uid for v in self.vertices):
            raise ConfigurationError(f"uid {vertex.uid!r} is used twice in job {self.name!r}; uids must be unique")
        if vertex.parallelism < 1:
            raise ConfigurationError(f"parallelism of {vertex.uid!r} must be >= 1")
        self.vertices.append(vertex)
        return vertex

    def _uid(self, uid: Optional[str], kind: str) -> str:
        self._counter += 1
        return uid or f"{kind}-{self._counter}"

    def source(self, source: Source, *, uid: Optional[str] = None, parallelism: Optional[int] = None,
               watermarks: Optional[WatermarkStrategy] = None) -> "DataStream":
        v = self._add(Vertex(self._uid(uid, "source"), "source", parallelism or self.default_parallelism,
                             source=source, watermarks=watermarks))
        return DataStream(self, [(v, None)])

    def validate(self) -> None:
        if not any(v.kind == "source" for v in self.vertices):
            raise ConfigurationError(f"job {self.name!r} has no source")
        if not any(v.kind == "sink" for v in self.vertices):
            raise ConfigurationError(f"job {self.name!r} has no sink: add .sink_to(...) or .collect(...)")

    def vertex(self, uid: str) -> Vertex:
        for v in self.vertices:
            if v.uid == uid:
                return v
        raise KeyError(uid)

    def downstream(self, vertex: Vertex) -> list[tuple[Vertex, Edge]]:
        return [(v, e) for v in self.vertices for e in v.inputs if e.upstream is vertex]

    @property
    def transactional_sinks(self) -> list[Vertex]:
        return [v for v in self.vertices if v.kind == "sink" and v.sink is not None]


class DataStream:
    """A stream produced by one or more vertices (several after ``union``)."""

    def __init__(self, graph: JobGraph, producers: list[tuple[Vertex, Optional[Callable[[Any], Hashable]]]]) -> None:
        self.graph = graph
        self.producers = producers  # (vertex, key_fn if keyed)

    def _edges(self, parallelism: int, rebalance: bool = False) -> list[Edge]:
        out = []
        for v, key_fn in self.producers:
            if key_fn is not None:
                out.append(Edge(v, "hash", key_fn))
            elif rebalance or v.parallelism != parallelism:
                out.append(Edge(v, "rebalance"))
            else:
                out.append(Edge(v, "forward"))
        return out

    def _operator(self, factory: Callable[[], ops.Operator], uid: Optional[str], parallelism: Optional[int],
                  kind: str) -> "DataStream":
        p = parallelism or self.graph.default_parallelism
        v = self.graph._add(Vertex(self.graph._uid(uid, kind), "operator", p, self._edges(p), factory))
        return DataStream(self.graph, [(v, None)])

    def map(self, fn: Callable[[Any], Any], *, uid: Optional[str] = None, parallelism: Optional[int] = None) -> "DataStream":
        return self._operator(lambda: ops.MapOperator(fn), uid, parallelism, "map")

    def filter(self, fn: Callable[[Any], bool], *, uid: Optional[str] = None,
               parallelism: Optional[int] = None) -> "DataStream":
        return self._operator(lambda: ops.FilterOperator(fn), uid, parallelism, "filter")

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], *, uid: Optional[str] = None,
                 parallelism: Optional[int] = None) -> "DataStream":
        return self._operator(lambda: ops.FlatMapOperator(fn), uid, parallelism, "flat_map")

    def process(self, factory: Callable[[], ops.Operator], *, uid: Optional[str] = None,
                parallelism: Optional[int] = None) -> "DataStream":
        """A custom :class:`~twophase.runtime.operators.Operator` (one instance per subtask)."""
        return self._operator(factory, uid, parallelism, "process")

    def union(self, *others: "DataStream") -> "DataStream":
        producers = list(self.producers)
        for o in others:
            if o.graph is not self.graph:
                raise ConfigurationError("cannot union streams of different jobs")
            producers.extend(o.producers)
        return DataStream(self.graph, producers)

    def key_by(self, key_fn: Callable[[Any], Hashable]) -> "KeyedStream":
        return KeyedStream(self.graph, [(v, key_fn) for v, _ in self.producers], key_fn)

    def sink_to(self, sink: SinkSpec, *, uid: Optional[str] = None, parallelism: Optional[int] = None,
                to_row: Optional[Callable[[Any], dict]] = None) -> Vertex:
        """Write into a two-phase-commit sink; records become Arrow rows: ``to_row(v)`` if given, else dicts as they are and ``{"value": v}`` otherwise."""
        if not isinstance(sink, SinkSpec):
            raise ConfigurationError(f"sink_to needs a SinkSpec, got {type(sink).__name__}; "
                                     "use collect() for a plain list")
        p = parallelism or self.graph.default_parallelism
        return self.graph._add(Vertex(self.graph._uid(uid, "sink"), "sink", p, self._edges(p), sink=sink, to_row=to_row))

    def collect(self, target: list, *, uid: Optional[str] = None, with_timestamps: bool = False) -> Vertex:
        """Append every record to ``target`` (not transactional: at-least-once after failures)."""
        return self.graph._add(Vertex(self.graph._uid(uid, "collect"), "sink", 1, self._edges(1),
                                      lambda: ops.CollectSinkOperator(target, with_timestamps)))


class KeyedStream(DataStream):
    """A stream partitioned by key (invariant 2); keyed operators get per-key state."""

    def __init__(self, graph: JobGraph, producers: list, key_fn: Callable[[Any], Hashable]) -> None:
        super().__init__(graph, producers)
        self.key_fn = key_fn

    def process_keyed(self, fn: Callable[[Any, ops.KeyedContext], Optional[Iterable[Any]]], *,
                      uid: Optional[str] = None, parallelism: Optional[int] = None) -> DataStream:
        key_fn = self.key_fn
        return self._operator(lambda: ops.KeyedProcessOperator(key_fn, fn), uid, parallelism, "keyed")

    def map(self, fn: Callable[[Any, ops.ValueState], Any], *, uid: Optional[str] = None,  # type: ignore[override]
            parallelism: Optional[int] = None) -> DataStream:
        """``fn(value, state) -> output`` with the record's key's :class:`ValueState`."""
        return self.process_keyed(ops.keyed_map(fn), uid=uid, parallelism=parallelism)

    def reduce(self, fn: Callable[[Any, Any], Any], *, uid: Optional[str] = None,
               parallelism: Optional[int] = None) -> DataStream:
        return self.process_keyed(ops.keyed_reduce(fn), uid=uid, parallelism=parallelism)

    def window(self, size: int, aggregate: AggregateFunction, *, uid: Optional[str] = None,
               parallelism: Optional[int] = None) -> DataStream:
        """Tumbling event-time windows of ``size`` (timestamp units) per key."""
        key_fn = self.key_fn
        return self._operator(lambda: TumblingEventTimeWindowOperator(key_fn, size, aggregate), uid, parallelism,
                              "window")
