"""The bounded random-kill soak: at least 200 SIGKILLs at random moments, zero duplicates."""

from __future__ import annotations

from pathlib import Path

from intentlog.testing._soak import soak


def test_random_kill_soak_never_duplicates(tmp_path: Path) -> None:
    report = soak(cycles=200, tasks=300, mode="both", seed=20261130, workdir=tmp_path)
    print(report.render())
    assert report.cycles == 200
    assert report.duplicates == 0
    assert report.unresolved == 0  # a service that can be asked never needs a person
    assert report.completed == report.tasks == 300
    assert report.applied == 900  # three effects per task, each exactly once
    assert report.left_after_kills > 0  # the kills fell while work remained


def test_random_kill_soak_on_a_service_that_can_do_neither(tmp_path: Path) -> None:
    report = soak(cycles=40, tasks=30, mode="neither", seed=7, workdir=tmp_path)
    print(report.render())
    assert report.duplicates == 0  # UNRESOLVED instead of a blind resend
    assert report.completed == 30
    assert report.applied == 90
