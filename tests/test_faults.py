"""twophase.faults: the fault-injection settings the crash tests and the nemesis rely on."""

from __future__ import annotations

import pytest

from twophase import faults


class Killed(BaseException):
    pass


@pytest.fixture
def kills(monkeypatch):
    got: list[str] = []

    def session() -> None:
        got.append("session")
        raise Killed()

    monkeypatch.setattr(faults, "kill_session", session)
    monkeypatch.delenv(faults.SCOPE_ENV, raising=False)
    return got


def test_faults_several_points_each_fire_once_per_marker(monkeypatch, tmp_path, kills):
    marker = tmp_path / "m"
    monkeypatch.setenv(faults.ENV, "write@1, before_complete@2,in_recovery")
    monkeypatch.setenv(faults.MARKER_ENV, str(marker))
    faults.maybe_crash("write", 0)            # other id
    faults.maybe_crash("after_commit", 1)     # other point
    with pytest.raises(Killed):
        faults.maybe_crash("write", 1)
    faults.maybe_crash("write", 1)            # a retry of the task: already fired
    with pytest.raises(Killed):
        faults.maybe_crash("in_recovery", 7)  # any id
    faults.maybe_crash("in_recovery", 8)
    with pytest.raises(Killed):
        faults.maybe_crash("before_complete", 2)
    assert [line.split()[:2] for line in marker.read_text().splitlines()] == \
        [["write", "1"], ["in_recovery", "7"], ["before_complete", "2"]]
    assert kills == ["session"] * 3


def test_faults_without_marker_fire_every_time(monkeypatch, kills):
    monkeypatch.setenv(faults.ENV, "mid_commit")
    monkeypatch.delenv(faults.MARKER_ENV, raising=False)
    for _ in range(2):
        with pytest.raises(Killed):
            faults.maybe_crash("mid_commit", 3)


def test_faults_bad_settings_name_the_variable(monkeypatch, kills):
    monkeypatch.setenv(faults.ENV, "nowhere@1")
    with pytest.raises(ValueError, match="TWOPHASE_FAULT='nowhere@1'.*unknown point"):
        faults.maybe_crash("write", 1)
    monkeypatch.setenv(faults.ENV, "write")
    monkeypatch.setenv(faults.SCOPE_ENV, "planet")
    with pytest.raises(ValueError, match="TWOPHASE_FAULT_SCOPE='planet'"):
        faults.maybe_crash("write", 1)


def test_faults_auto_scope_outside_an_executor_kills_the_session(monkeypatch, kills):
    """No ancestor is an executor JVM here (a test process): ``auto`` falls back to the session."""
    monkeypatch.setenv(faults.ENV, "write")
    monkeypatch.setenv(faults.SCOPE_ENV, "auto")
    with pytest.raises(Killed):
        faults.maybe_crash("write", 1)
    assert kills == ["session"]
