"""Every sink on a real Spark standalone cluster under the nemesis (integration/nemesis/harness.py).

* ``test_cluster_crash_matrix[sink]`` (with ``TWOPHASE_NEMESIS=1``; scripts/nemesis.sh ``--faults matrix``):
  every protocol point of the sink once, in one chain of runs on the cluster; executor points kill one executor JVM (the job goes on, the task is retried on the other),
  driver points the driver (restarted); recovery itself is killed once (``in_recovery``). Afterwards,
  and after each driver kill: every input record exactly once, no leftovers, every log record final.
* ``test_cluster_nemesis[sink-fault]``: a short selection of random faults from a fixed seed
  (``TWOPHASE_NEMESIS_SEED`` overrides it; each outcome prints the seed that replays it with
  ``scripts/nemesis.sh``). By default two of the four pairs run, a window that moves with the checked-out
  commit (``TWOPHASE_NEMESIS_ROTATION=N`` picks it); ``TWOPHASE_NEMESIS=1`` runs every sink with every
  fault kind instead.

The fixtures share one cluster, one S3 server and one broker with the rest of the session.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from integration.cluster.conftest import SparkCluster
from integration.nemesis.harness import KAFKA_CLUSTER_FAULTS, SINKS, Cluster, Servers, faults_for, run_scenario

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.spark]

SEED = os.environ.get("TWOPHASE_NEMESIS_SEED", "20261122")
LONG = os.environ.get("TWOPHASE_NEMESIS") == "1"
#: the default suite's selection: a different process or server fault for each sink
SHORT = [("s3", "executor_jvm"), ("kafka", "python_worker"), ("delta", "fetch_failed"), ("files", "speculation")]
#: (the Kafka faults that need the 3-broker cluster run in scripts/nemesis.sh, where Kafka is that cluster)
SELECTION = [(s, f) for s in SINKS for f in faults_for(s) if f not in KAFKA_CLUSTER_FAULTS] if LONG else SHORT
#: how many of SHORT one default run takes (about 50 s each): a window that moves with the commit
ROTATE = 2


def _rotation_key() -> int:
    """``TWOPHASE_NEMESIS_ROTATION`` (an integer), else the checked-out commit, else 0: the same commit
    always runs the same pairs, so a failure replays; successive commits cover every pair."""
    given = os.environ.get("TWOPHASE_NEMESIS_ROTATION")
    if given:
        return int(given)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        return int(head[:8], 16) if head else 0
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def rotated_in(pair: tuple[str, str], key: int) -> bool:
    """Whether the default run at rotation ``key`` takes ``pair`` of SHORT (every pair with TWOPHASE_NEMESIS=1)."""
    if LONG or pair not in SHORT:
        return True
    start = key % len(SHORT)
    return SHORT.index(pair) in {(start + i) % len(SHORT) for i in range(ROTATE)}


@pytest.fixture(scope="module")
def servers(spark_master: SparkCluster, request: pytest.FixtureRequest) -> Servers:
    """The cluster plus, lazily, the S3 server and the broker (a files-only run starts neither)."""
    s = Servers(Cluster(spark_master.master_url, spark_master.directory if spark_master.managed else ""))
    s.request = request  # type: ignore[attr-defined]
    return s


def _ready(servers: Servers, sink: str) -> Servers:
    req = servers.request  # type: ignore[attr-defined]
    if sink in ("s3", "delta") and servers.s3 is None:
        servers.s3 = req.getfixturevalue("s3_server")
    if sink == "kafka" and servers.kafka is None:
        servers.kafka = req.getfixturevalue("kafka_bootstrap")
    if sink.startswith("azure-") and servers.azure is None:
        servers.azure = req.getfixturevalue("azure_server")
    return servers


def _assert_ok(o) -> None:
    detail = "\n".join([o.line(), *o.events, *o.leftovers[:20], str(o.unfinished)])
    assert o.ok, detail


@pytest.mark.skipif(not LONG, reason="each sink's crash matrix on the cluster (3-6 min each): TWOPHASE_NEMESIS=1")
@pytest.mark.parametrize("sink", SINKS)
def test_cluster_crash_matrix(sink: str, servers: Servers, tmp_path) -> None:
    o = run_scenario(sink, "matrix", SEED, _ready(servers, sink), str(tmp_path))
    assert o.faults_injected == 7, f"expected all 7 points to fire: {o.events}"
    _assert_ok(o)


@pytest.mark.parametrize("sink,fault", SELECTION, ids=[f"{s}-{f}" for s, f in SELECTION])
def test_cluster_nemesis(sink: str, fault: str, servers: Servers, tmp_path) -> None:
    key = _rotation_key()
    if not rotated_in((sink, fault), key):
        pytest.skip(f"rotated out at rotation {key} ({ROTATE} of the {len(SHORT)} pairs run per commit; "
                    "TWOPHASE_NEMESIS_ROTATION=N picks, TWOPHASE_NEMESIS=1 runs all)")
    if fault == "worker" and not servers.cluster.directory:
        pytest.skip("killing a whole worker needs a cluster this session started (it heals it afterwards)")
    o = run_scenario(sink, fault, SEED, _ready(servers, sink), str(tmp_path))
    assert o.faults_injected >= 1, f"no fault was injected: {o.events}"
    _assert_ok(o)

