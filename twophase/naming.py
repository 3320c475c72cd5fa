"""Names that carry the sink's identity, so that a sweep can prove a name is its own.

Every file, object and staging folder a sink creates is named with its *token* (a short digest of
the sink id). Two sinks writing into one folder, bucket prefix or Delta table (two queries appending
to one table is Delta's ordinary multi-writer case) therefore never mistake each other's data for
their own leftovers (invariant 5 of :mod:`twophase.sink`).

Layout shared by the file, S3 and Delta sinks::

    <root>/_twophase/<token>/log/                              the sink's transaction log (default)
    <root>/_twophase/<token>/staging/<ckpt>/<task>-<attempt>/  staged files (file sink)
    <root>/<partition dirs>/part-<token>-<ckpt>-<task>-<attempt>-<seq>.<ext>   data files

``<task>`` is whatever task id the engine gave (Spark's partition id, the embedded runtime's
``<uid>-<subtask>``, which has dashes): a name is parsed from both ends (token and checkpoint from the
left, attempt, sequence and extension from the right), so the task segment may hold anything but ``/``
(which :func:`part_file_name` replaces, with every other character outside ``[A-Za-z0-9._-]``).
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Optional, Sequence

from twophase.sink import sink_token

INTERNAL_DIR = "_twophase"

#: token and checkpoint from the left; attempt uid, sequence and extension (no ``-`` in them) from the right;
#: the task is what lies between (any characters but ``/``: runtime task ids are ``<uid>-<subtask>``)
_PART = re.compile(r"^part-([0-9a-f]{12})-(\d{8,})-([^/]+)-([0-9a-f]{12})-(\d{3,})\.[a-z0-9.]+$")
#: what a task segment keeps; anything else (a ``/`` of a runtime uid, spaces) becomes ``_``
_TASK_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
#: a Hive partition folder: ``<col>=<value>`` (both escaped, so neither holds ``/`` and the column no ``=``)
_HIVE_DIR = re.compile(r"^([^=/]+)=[^/]*$")


def internal_rel(sink_id: str) -> str:
    """``_twophase/<token>``: the sink's own folder under its root."""
    return f"{INTERNAL_DIR}/{sink_token(sink_id)}"


def default_log_location(root: str, sink_id: str) -> str:
    """Where a file, S3 or Delta sink rooted at ``root`` keeps its log unless ``log.location`` is given."""
    return f"{root.rstrip('/')}/{internal_rel(sink_id)}/log"


def part_file_name(sink_id: str, checkpoint_id: int, task_id: str, attempt_uid: str, seq: int, ext: str) -> str:
    """``part-<token>-<checkpoint>-<task>-<attempt>-<seq>.<ext>``: the sink's, unique per attempt."""
    task = int(task_id) if task_id.isascii() and task_id.isdigit() else _TASK_UNSAFE.sub("_", task_id)
    return f"part-{sink_token(sink_id)}-{checkpoint_id:08d}-{task:>05}-{attempt_uid}-{seq:03d}.{ext}"


def part_name_prefix(sink_id: str, checkpoint_id: int) -> str:
    """``part-<token>-<checkpoint>-``: what every base name of the sink's files of ``checkpoint_id`` starts with
    (:func:`part_file_name`), and no other checkpoint's (the checkpoint is followed by ``-``): a sweep lists
    one checkpoint's names of a folder by this prefix."""
    return f"part-{sink_token(sink_id)}-{checkpoint_id:08d}-"


def own_part_checkpoint(name: str, sink_id: str) -> Optional[int]:
    """The checkpoint id of ``name`` (a base name) if this sink made it, else None."""
    m = _PART.match(name)
    if m is None or m.group(1) != sink_token(sink_id):
        return None
    return int(m.group(2))


def own_part_rel(rel: str, sink_id: str, partition_by: Sequence[str]) -> Optional[int]:
    """The checkpoint id of ``rel`` (a name relative to the sink's path) if this sink made it AND it lies exactly
    where the sink puts its files: under ``len(partition_by)`` folders ``<col>=<value>`` whose columns are
    ``partition_by`` in order (``p=1/q=x/`` for ``('p', 'q')``; the column compared unescaped and
    case-insensitively, as Spark names columns), or directly under its path (where an unpartitioned sink
    writes; a name there is never a nested destination's, which are all in sub-folders, so it is taken
    whatever the partition columns, and an unpartitioned run's leftovers are still swept after a change).

    A name anywhere else is not the sink's, even with its token: another destination nested in this one
    (``s3://b/out/eu``, or the one-job-per-partition ``s3://b/out/region=eu``, under ``s3://b/out``) given the
    same ``sink.id`` names its files with the same token, and a sweep of ``out`` must never drop what the
    nested one pre-committed or committed. A nested destination exactly at one of the sink's own partition
    folders (``out/region=eu`` under ``out`` partitioned by ``region``) cannot be told apart by its names:
    give it its own ``sink.id``. A sink whose partition columns changed between runs no longer recognises
    the old layout's leftovers in partition folders: they are kept (a leak, never a deletion of others' data)."""
    *dirs, name = rel.split("/")
    if dirs and len(dirs) != len(partition_by):
        return None
    for d, col in zip(dirs, partition_by):
        m = _HIVE_DIR.match(d)
        if m is None or urllib.parse.unquote(m.group(1)).casefold() != col.casefold():
            return None
    return own_part_checkpoint(name, sink_id)
