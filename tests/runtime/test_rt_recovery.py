"""Recovery: randomized task failures under each restart strategy, SIGKILL of a job process,
expired checkpoints (cancel markers), all checked through the real file sink: every record exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from rt_helpers import assert_exactly_once, completed_records, keyed_counts, runner, two_source_job
from twophase.errors import JobFailedError
from twophase.runtime import FailureRateRestart, FixedDelayRestart, NoRestart

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RandomFailures:
    """Raises ``times`` times, each on a random record (1..max_k) counted since the previous failure."""

    def __init__(self, rng: random.Random, times: int, max_k: int) -> None:
        self.rng, self.left, self.max_k = rng, times, max_k
        self.k, self.seen, self.fired = rng.randint(1, max_k), 0, 0

    def __call__(self, v):
        if self.left:
            self.seen += 1
            if self.seen >= self.k:
                self.left -= 1
                self.fired += 1
                self.seen, self.k = 0, self.rng.randint(1, self.max_k)
                raise RuntimeError(f"injected failure {self.fired}")
        return v


STRATEGIES = {
    "fixed-delay": lambda: FixedDelayRestart(attempts=5, delay_s=0.01),
    "failure-rate": lambda: FailureRateRestart(max_failures=5, interval_s=10.0, delay_s=0.01),
}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_job_random_task_failures_exactly_once(tmp_path, strategy, seed):
    rng = random.Random(seed)
    out = str(tmp_path / "out")
    before = RandomFailures(rng, 2, 3000)  # fails before the keyed state
    after = RandomFailures(rng, 1, 3000)   # fails between the keyed state and the sink
    mode = rng.choice(["aligned", "unaligned"])
    g, sink, expected = two_source_job(out, map_fn=before, key_parallelism=2,
                                       extra=lambda s: s.map(after, uid="post"))
    result = runner(g, mode, restart=STRATEGIES[strategy]()).run()
    # Two tasks may each fire inside one attempt (they run concurrently, and the second failure lands
    # before the attempt is torn down), so an attempt ends for at least one and possibly two failures.
    assert 1 <= result.attempts - 1 <= before.fired + after.fired
    assert_exactly_once(out, expected)
    assert keyed_counts(completed_records(sink)[-1].task_state) == {"a0": 8000, "b0": 2000}
    assert result.metrics.recovery_times_s, "a checkpoint completed after each failure"


def test_job_no_restart_fails_then_resumes_from_log(tmp_path):
    out = str(tmp_path / "out")
    fail = RandomFailures(random.Random(7), 1, 2000)
    g, sink, expected = two_source_job(out, map_fn=fail)
    with pytest.raises(JobFailedError, match="injected failure"):
        runner(g, restart=NoRestart()).run()
    assert fail.fired == 1
    result = runner(g, restart=NoRestart()).run()  # a new run resumes from the log's latest checkpoint
    assert result.attempts == 1
    assert_exactly_once(out, expected)


def test_tasks_inv2_expired_checkpoints_are_cancelled_and_data_carried_forward(tmp_path):
    """Checkpoints that time out are aborted (cancel markers flow); pre-committed files of the sink are
    carried into the next checkpoint, so nothing is lost or duplicated."""
    out = str(tmp_path / "out")
    g, sink, expected = two_source_job(out, b_delay=0.06)
    result = runner(g, "aligned", interval=0.02, timeout_s=0.03, tolerable_failures=1000).run()
    states = [r.state.value for r in sink.transaction_log().records()]
    assert "ABORTED" in states, "some checkpoints must expire behind the slow source"
    assert result.metrics.checkpoints_completed
    assert_exactly_once(out, expected)


def test_job_checkpoint_failures_beyond_tolerable_fail_the_job(tmp_path):
    g, sink, expected = two_source_job(str(tmp_path / "out"), b_delay=0.06)
    with pytest.raises(JobFailedError, match="checkpoints failed in a row"):
        runner(g, "aligned", interval=0.02, timeout_s=0.01, tolerable_failures=0, restart=NoRestart()).run()


CRASH_JOB = textwrap.dedent('''
    import sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from rt_helpers import runner, two_source_job
    g, sink, expected = two_source_job({out!r}, name="crash-job")
    runner(g, "aligned", interval=0.03).run()
    print("FINISHED")
''')


@pytest.mark.parametrize("point", ["after_pre_commit@2", "after_complete@2", "mid_commit@3"])
def test_job_sigkill_and_restart_from_log_exactly_once(tmp_path, point):
    out, marker = str(tmp_path / "out"), str(tmp_path / "marker")
    script = tmp_path / "job.py"
    script.write_text(CRASH_JOB.format(root=ROOT, tests=os.path.join(ROOT, "tests", "runtime"), out=out))
    env = dict(os.environ, TWOPHASE_FAULT=point, TWOPHASE_FAULT_MARKER=marker)
    p = subprocess.run([sys.executable, str(script)], env=env, start_new_session=True, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr
    assert os.path.exists(marker) and open(marker).read().startswith(point.split("@")[0]), "the crash really happened"
    env.pop("TWOPHASE_FAULT")
    p = subprocess.run([sys.executable, str(script)], env=env, start_new_session=True, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "FINISHED" in p.stdout, p.stderr
    _, _, expected = two_source_job(str(tmp_path / "unused"), name="x")
    assert_exactly_once(out, expected)
