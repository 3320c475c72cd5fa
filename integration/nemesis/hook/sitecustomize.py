"""The nemesis's commit hook (``coordinator_kill``): loaded by Python at start-up when the harness puts this
directory on ``PYTHONPATH`` (only for that fault's run, only in the driver's environment: the driver and the
Python workers Spark's driver starts for the data source's commit inherit it; executors do not).

With ``TWOPHASE_NEMESIS_COMMIT_HOOK=<path>:<k>`` the k-th EndTxn(commit) sent by the run's driver side (k >= 1,
counted across its processes) first writes ``<path>.ready`` holding the transactional id it is about to commit,
then waits (at most 90 s) for ``<path>.go``: in between, the harness SIGKILLs the broker that coordinates that id.
So the kill lands mid-commit, after the decision is durable (and after k-1 transactions of the run committed)
and before this EndTxn goes out. Never raises: a hook that cannot install itself leaves the run unfaulted (the
harness then fails the scenario: its ``.ready`` never appears)."""

from __future__ import annotations

import os

_SPEC = os.environ.get("TWOPHASE_NEMESIS_COMMIT_HOOK", "")


def _install(path: str, k: int) -> None:
    import time

    from twophase.sinks import _kafka_txn

    original = _kafka_txn.TxnClient.end_txn

    def claim(name: str) -> bool:
        try:
            os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
        except FileExistsError:
            return False

    def end_txn(self, transactional_id, producer_id, epoch, *, commit):
        if commit and not os.path.exists(path + ".ready"):
            n = next(i for i in range(1, 10_000) if claim(f"{path}.n{i}"))
            if n == k:
                with open(path + ".ready.tmp", "w") as f:
                    f.write(transactional_id)
                os.replace(path + ".ready.tmp", path + ".ready")
                deadline = time.monotonic() + 90
                while not os.path.exists(path + ".go") and time.monotonic() < deadline:
                    time.sleep(0.05)
        return original(self, transactional_id, producer_id, epoch, commit=commit)

    _kafka_txn.TxnClient.end_txn = end_txn


if _SPEC:
    try:
        _path, _, _k = _SPEC.rpartition(":")
        _install(_path, int(_k))
    except Exception:  # noqa: BLE001 - see the module docstring
        pass
