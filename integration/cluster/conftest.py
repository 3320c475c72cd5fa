"""The ``spark_master`` fixture: a Spark standalone cluster for the whole session.

``TWOPHASE_SPARK_MASTER=spark://host:port`` uses an existing cluster (never started nor stopped here;
tests that kill executor processes need it to run on this host). Otherwise ``scripts/spark_cluster.sh``
starts a master and two 1-core workers on loopback, on free ports, and stops exactly those processes
at the end of the session.

Jobs on it run in client mode (the driver is the test's subprocess) with executors in separate JVMs,
one core each, two in all. Their Python workers run ``PYSPARK_PYTHON`` (this venv's interpreter),
in which the repository is installed editable (``pip install -e .``): the ``twophase``, ``sinks`` and
``sources`` packages are importable on the executors exactly as a user who installed twophase on the
cluster's nodes would have them, so no ``spark.submit.pyFiles`` is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "spark_cluster.sh")


@dataclass
class SparkCluster:
    """A running standalone cluster and the settings a job on it uses."""

    master_url: str
    #: True when this session started the cluster (its daemons' PIDs are known)
    managed: bool
    directory: str = ""
    pids: dict[str, int] = field(default_factory=dict)

    def conf(self) -> dict[str, str]:
        """Spark settings of a job on this cluster: executors in their own JVMs, retries allowed."""
        return {
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.executor.memory": "1g",
            "spark.task.maxFailures": "4",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executorEnv.PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            "spark.sql.streaming.stopTimeout": "30s",
        }

    def job_args(self) -> list[str]:
        """Command-line arguments for integration/jobs/file_job.py to run on this cluster."""
        args = ["--master", self.master_url]
        for k, v in self.conf().items():
            args += ["--conf", f"{k}={v}"]
        return args


def _read_env(path: str) -> dict[str, str]:
    out = {}
    with open(path) as f:
        for line in f:
            k, sep, v = line.strip().partition("=")
            if sep:
                out[k] = v
    return out


@pytest.fixture(scope="session")
def spark_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """The cluster: ``TWOPHASE_SPARK_MASTER`` if set, else one started by scripts/spark_cluster.sh."""
    external = os.environ.get("TWOPHASE_SPARK_MASTER")
    if external:
        if not external.startswith("spark://"):
            pytest.fail(f"TWOPHASE_SPARK_MASTER={external!r}: expected spark://host:port")
        yield SparkCluster(master_url=external, managed=False)
        return
    directory = str(tmp_path_factory.mktemp("spark-cluster"))
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["PYTHON"] = sys.executable
    started = subprocess.run(["bash", SCRIPT, "start", directory], env=env, capture_output=True, text=True,
                             timeout=240)
    if started.returncode != 0:
        subprocess.run(["bash", SCRIPT, "stop", directory], env=env, timeout=60)
        pytest.fail(f"scripts/spark_cluster.sh start failed:\n{started.stderr[-3000:]}")
    recorded = _read_env(os.path.join(directory, "cluster.env"))
    cluster = SparkCluster(master_url=recorded["SPARK_MASTER_URL"], managed=True, directory=directory,
                           pids={k: int(v) for k, v in recorded.items() if k.endswith("_PID")})
    try:
        yield cluster
    finally:
        subprocess.run(["bash", SCRIPT, "stop", directory], env=env, timeout=60)
