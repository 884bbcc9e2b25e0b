"""The bounded random-kill soak: at least 200 SIGKILLs at random moments, zero duplicates."""

from __future__ import annotations

from pathlib import Path

import pytest

from intentlog.testing._soak import soak


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_random_kill_soak_never_duplicates(tmp_path: Path) -> None:
    report = soak(cycles=200, tasks=300, mode="both", seed=20261130, workdir=tmp_path)
    print(report.render())
    assert report.cycles == 200
    assert report.duplicates == 0
    assert report.unresolved == 0  # a service that can be asked never needs a person
    assert report.completed == report.tasks == 300
    assert report.applied == 900  # three effects per task, each exactly once
    assert report.left_after_kills > 0  # the kills fell while work remained
    assert report.mid_step > 0  # and not only where the child waits to start a step


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_random_kill_soak_on_a_service_that_can_do_neither(tmp_path: Path) -> None:
    report = soak(cycles=40, tasks=30, mode="neither", seed=7, workdir=tmp_path)
    print(report.render())
    assert report.cycles == 40
    assert report.duplicates == 0  # UNRESOLVED instead of a blind resend
    assert report.completed == 30
    assert report.applied == 90
    assert report.left_after_kills > 0


def test_every_kill_falls_while_work_remains_however_little_work_there_is(
    tmp_path: Path,
) -> None:
    # Two tasks are done in a fraction of one interpreter start-up: a kill timed by the wall
    # clock falls after the work as often as not. Kills timed by progress cannot.
    report = soak(cycles=30, tasks=2, mode="both", seed=3, workdir=tmp_path)
    print(report.render())
    assert report.cycles == 30
    assert report.left_after_kills > 0
    assert report.duplicates == 0
    assert report.completed == 2 and report.applied == 6
