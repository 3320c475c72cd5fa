"""The embedded streaming runtime: job graphs run as threads, with Flink-style barrier checkpoints.

Modules, one job each: :mod:`~twophase.runtime.graph` (the job graph), :mod:`~twophase.runtime.channels`
(bounded channels, stream elements, partitioning), :mod:`~twophase.runtime.barriers` (aligning,
tracking and unaligned barrier handlers), :mod:`~twophase.runtime.watermarks` (the status watermark
valve), :mod:`~twophase.runtime.operators` and :mod:`~twophase.runtime.windows`,
:mod:`~twophase.runtime.sources` (split sources), :mod:`~twophase.runtime.tasks` (task threads),
:mod:`~twophase.runtime.committer` (the sinks as the coordinator sees them),
:mod:`~twophase.runtime.restart`, :mod:`~twophase.runtime.savepoint` and :mod:`~twophase.runtime.job`
(the runner). The checkpoint coordinator and the transaction log are the core's.
"""

from twophase.runtime.barriers import AligningBarrierHandler, TrackingBarrierHandler, UnalignedBarrierHandler
from twophase.runtime.graph import DataStream, JobGraph, KeyedStream
from twophase.runtime.job import CheckpointConfig, JobResult, JobRunner, JobStatus
from twophase.runtime.operators import KeyedContext, Operator, ValueState
from twophase.runtime.restart import FailureRateRestart, FixedDelayRestart, NoRestart, parse_restart_strategy
from twophase.runtime.savepoint import Savepoint
from twophase.runtime.sources import CollectionSource, FileLinesSource, ReadResult, Source, SplitReader
from twophase.runtime.watermarks import StatusWatermarkValve, WatermarkStrategy
from twophase.runtime.windows import COUNT, AggregateFunction, sum_of

__all__ = [
    "COUNT", "AggregateFunction", "AligningBarrierHandler", "CheckpointConfig", "CollectionSource", "DataStream",
    "FailureRateRestart", "FileLinesSource", "FixedDelayRestart", "JobGraph", "JobResult", "JobRunner", "JobStatus",
    "KeyedContext", "KeyedStream", "NoRestart", "Operator", "ReadResult", "Savepoint", "Source", "SplitReader",
    "StatusWatermarkValve", "TrackingBarrierHandler", "UnalignedBarrierHandler", "ValueState", "WatermarkStrategy",
    "parse_restart_strategy", "sum_of",
]
