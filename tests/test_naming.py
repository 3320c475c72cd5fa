"""Names that carry the sink's identity (:mod:`twophase.naming`): every name a sink makes is found again
by its own sweep (its checkpoint id read back), whatever task id the engine gave, and by no other sink's."""

from __future__ import annotations

import pytest

from twophase.naming import own_part_checkpoint, own_part_rel, part_file_name

#: every task-id shape the engines produce: Spark partition ids (streaming writes, foreach_batch, batch
#: write jobs, the native writers' ``str(int(part-NNNNN))``), the embedded runtime's ``<uid>-<subtask>``
#: (tasks.py builds the sink's TransactionContext with it) for uids of every form a user may give
#: (dashes, digits, a uid that looks like a checkpoint id or an attempt uid, dots, capitals, spaces, a slash),
#: and twophase.testing's free-form task names
TASK_IDS = ["0", "7", "00012", "123456", "4294967296",
            "out-0", "out-12", "sink-1-3", "my_sink-0", "Out.Sink-2", "00000003-1", "0123456789ab-0",
            "x-00000001-0123456789ab-001-0", "a b-0", "a/b-0", "ü-1", "t", "task-a"]


@pytest.mark.parametrize("task", TASK_IDS)
@pytest.mark.parametrize("checkpoint_id", [0, 3, 12345678, 123456789012])
def test_naming_every_task_id_shape_round_trips_to_its_checkpoint(task: str, checkpoint_id: int) -> None:
    """A part name made for any task id the engines produce reads back as this sink's, with its checkpoint id
    (the sweeps find the leftovers of every engine's crashed attempts), is one path segment, and is never
    another sink's."""
    for ext in ("parquet", "snappy.parquet", "json", "csv.gz"):
        name = part_file_name("sink-a", checkpoint_id, task, "0123456789ab", 7, ext)
        assert "/" not in name, name
        assert own_part_checkpoint(name, "sink-a") == checkpoint_id, name
        assert own_part_checkpoint(name, "sink-b") is None, name


def test_naming_runtime_task_ids_are_swept() -> None:
    """The embedded runtime names its sink tasks ``<uid>-<subtask>`` (``out-0``): their files are the sink's
    own, so a sweep drops what a crashed runtime attempt left (it used to match none of them)."""
    name = part_file_name("s", 4, "out-0", "a1b2c3d4e5f6", 0, "parquet")
    assert own_part_checkpoint(name, "s") == 4


@pytest.mark.parametrize("name", [
    "data.parquet", "part-00000-1234.c000.snappy.parquet",  # Spark's own names
    "part-0123456789ab-00000001-0-0123456789ab.parquet",  # no sequence
    "part-0123456789ab-0000001-0-0123456789ab-000.parquet",  # checkpoint of 7 digits
    "part-0123456789ab-00000001--0123456789ab-000.parquet",  # empty task
    "part-0123456789ab-00000001-0-0123456789ab-000",  # no extension
    "part-0123456789ab-00000001-0-0123456789aB-000.parquet",  # attempt not lower-case hex
])
def test_naming_names_of_other_shapes_are_never_own(name: str) -> None:
    """Only the exact shape the sinks make is taken as own (a sweep never removes a name it cannot prove)."""
    assert own_part_checkpoint(name, "s") is None
    assert own_part_checkpoint(name.replace("0123456789ab", "000000000000", 1), "s") is None


def test_naming_own_part_rel_takes_only_the_sinks_layout() -> None:
    """A sweep of a sink at ``path`` takes a name only where the sink puts its files: directly under its path
    (where an unpartitioned sink writes; never a nested destination's), or under exactly its partition
    columns' folders ``<col>=<value>`` in order. A name under any other folder (another destination nested in this one, ``s3://b/out/eu`` under
    ``s3://b/out``, even with the same sink id) is not its own."""
    name = part_file_name("s", 5, "0", "0123456789ab", 0, "parquet")
    assert own_part_rel(name, "s", ()) == 5
    assert own_part_rel(f"a=1/{name}", "s", ("a",)) == 5
    assert own_part_rel(f"a=1/b=__HIVE_DEFAULT_PARTITION__/{name}", "s", ("a", "b")) == 5
    assert own_part_rel(f"eu/{name}", "s", ()) is None
    assert own_part_rel(f"eu/a=1/{name}", "s", ("a",)) is None
    assert own_part_rel(f"a=1/eu/{name}", "s", ("a",)) is None
    assert own_part_rel(f"_twophase/{name}", "s", ()) is None
    assert own_part_rel(f"=1/{name}", "s", ("",)) is None
    assert own_part_rel(f"a=1/{name}", "other", ("a",)) is None


def test_naming_own_part_rel_inv5_a_hive_looking_folder_of_another_column_is_not_the_sinks() -> None:
    """The one-job-per-partition layout: ``out/region=eu`` nested in ``out`` with the same sink id. Only folders
    of the sink's own partition columns, in order and at exactly their depth, are its layout: ``region=eu`` is
    not the folder of a sink partitioned by ``p`` nor of an unpartitioned one; a sink partitioned by ``region``
    takes it (its own partition folder; names there are indistinguishable). Columns compare unescaped and
    case-insensitively (Spark writes the DataFrame's spelling)."""
    name = part_file_name("s", 5, "0", "0123456789ab", 0, "parquet")
    assert own_part_rel(f"region=eu/{name}", "s", ()) is None
    assert own_part_rel(f"region=eu/{name}", "s", ("p",)) is None
    assert own_part_rel(f"region=eu/p=a/{name}", "s", ("p",)) is None
    assert own_part_rel(f"p=a/region=eu/{name}", "s", ("p",)) is None
    assert own_part_rel(f"region=eu/p=a/{name}", "s", ("p", "region")) is None  # order matters
    assert own_part_rel(f"p=a/{name}", "s", ("p", "q")) is None  # too shallow
    assert own_part_rel(name, "s", ("p",)) == 5  # directly under the path: never a nested destination's
    assert own_part_rel(f"region=eu/{name}", "s", ("region",)) == 5
    assert own_part_rel(f"Region=eu/{name}", "s", ("region",)) == 5
    assert own_part_rel(f"a%3Db=1/{name}", "s", ("a=b",)) == 5
