"""The warning of ``intentlog check`` and of a worker at start when the journal's PostgreSQL
server commits without a synchronous standby while effects a lost commit can duplicate are
registered (see docs/deploy.md, "Failover"). On throwaway clusters with standbys, the same
warning is checked in tests/test_pg_failover.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

import intentlog
from failover_app import effects
from intentlog._replication import Replication, warning
from intentlog.cli import cli

EFFECTS = effects({n: "http://127.0.0.1:9" for n in ("charge", "reserve", "notify")})
CHARGE, RESERVE, NOTIFY = EFFECTS
ASYNC = Replication("on", "", 0, in_recovery=False)


def test_a_server_without_a_synchronous_standby_is_named_with_the_effects_at_risk() -> None:
    line = warning(ASYNC, EFFECTS)
    assert line is not None
    assert line.startswith(
        "the journal's PostgreSQL server commits without waiting for a synchronous standby "
        "(synchronous_commit=on, synchronous_standby_names=''): a failover to a standby loses"
    )
    assert "notify (can neither deduplicate nor be asked: a lost receipt ends UNRESOLVED" in line
    assert "reserve (can be asked but does not deduplicate: a lost intent sends it again)" in line
    assert "charge" not in line  # a deduplicating effect is resent with its key: applied once
    # Named standbys do not help a session that does not wait for them.
    off = Replication("local", '"standby1"', 1, in_recovery=False)
    assert warning(off, [NOTIFY]) is not None and "synchronous_commit=local" in warning(
        off, [NOTIFY]
    )


@pytest.mark.parametrize(
    "facts",
    [
        None,  # not PostgreSQL
        Replication("on", 'ANY 1 ("s1", "s2")', 1, in_recovery=False),
        Replication("remote_apply", "s1", 2, in_recovery=False),
        Replication("on", "s1", None, in_recovery=False),  # may not see pg_stat_replication
        Replication("on", "", 0, in_recovery=True),  # a standby: the journal cannot write there
    ],
)
def test_no_warning_where_commits_wait_for_a_streaming_standby(
    facts: Replication | None,
) -> None:
    assert warning(facts, EFFECTS) is None


def test_no_warning_where_every_effect_deduplicates() -> None:
    assert warning(ASYNC, [CHARGE]) is None


def test_a_named_standby_that_is_not_streaming_is_said() -> None:
    line = warning(Replication("on", "s1", 0, in_recovery=False), [NOTIFY])
    assert line is not None and "shows none streaming now" in line


@pytest.fixture
def journal_url(pg_url: str) -> str:
    """A journal on the test server, which has no standby."""
    intentlog.open(pg_url).close()
    return pg_url


def test_check_says_it_for_a_journal_on_a_server_without_a_standby(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "support"))
    args = ["--db", journal_url, "check", "--effects", "failover_app:EFFECTS"]
    args += ["--restart-within", "1m"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 3, result.output  # notify can do neither: a problem already
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(lines) == 1, result.stderr
    assert "commits without waiting for a synchronous standby" in lines[0]
    assert "notify (can neither" in lines[0] and "reserve (can be asked" in lines[0]
    doc = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    assert doc["journal_warning"] == lines[0].removeprefix("warning: ")
    # Only deduplicating effects: nothing to say.
    args[args.index("failover_app:EFFECTS")] = "failover_app:CHARGE"
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr


def test_check_says_when_it_cannot_ask_the_server(pg_url: str) -> None:
    args = ["--db", pg_url, "check", "--effects", "intentlog.demo:EFFECTS"]
    result = CliRunner().invoke(cli, [*args, "--restart-within", "1m"])
    assert "warning: cannot read how the journal's server replicates its commits" in result.stderr
    assert "no journal at" in result.stderr  # the schema was never created, nor is it now


def test_a_worker_says_it_at_start(journal_url: str, caplog: pytest.LogCaptureFixture) -> None:
    registry = intentlog.Registry(effects=EFFECTS)
    with (
        intentlog.open(journal_url) as journal,
        caplog.at_level(logging.WARNING, logger="intentlog.worker"),
    ):
        intentlog.Worker(journal, registry).run(exit_when_idle=True)
    logged = [r.getMessage() for r in caplog.records if "synchronous standby" in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].startswith("intentlog check: warning: the journal's PostgreSQL server")


def test_a_worker_on_sqlite_says_nothing_of_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        intentlog.open(tmp_path / "j.db") as journal,
        caplog.at_level(logging.WARNING, logger="intentlog.worker"),
    ):
        intentlog.Worker(journal, intentlog.Registry(effects=EFFECTS)).run(exit_when_idle=True)
    assert not [r for r in caplog.records if "synchronous standby" in r.getMessage()]
    assert [r for r in caplog.records if "effect 'notify': can neither" in r.getMessage()]
