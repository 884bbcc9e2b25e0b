"""Whether a failover of the journal's PostgreSQL server can lose commits it acknowledged.

A commit on PostgreSQL is durable on the server that acknowledged it. Whether it is also on a
standby depends on two settings: with ``synchronous_standby_names`` naming standbys and
``synchronous_commit`` at ``on``, ``remote_write`` or ``remote_apply``, a commit returns only
once a synchronous standby has it; otherwise the standbys replicate asynchronously and a
failover to one loses the commits it had not received yet
(https://www.postgresql.org/docs/15/warm-standby.html#SYNCHRONOUS-REPLICATION,
https://www.postgresql.org/docs/15/runtime-config-wal.html#GUC-SYNCHRONOUS-COMMIT).

What a lost commit does to an effect (measured in docs/deploy.md): a lost receipt is settled
by asking the service or resending the key it deduplicates on, but ends UNRESOLVED for an
effect that can do neither; a lost intent makes the task send the effect again as if for the
first time, which applies it twice wherever the service does not deduplicate. So the journal's
server is worth a warning when it commits without a synchronous standby and effects that do
not deduplicate are registered: :func:`warning` words it, for ``intentlog check`` and for a
worker at start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from intentlog._effect import Effect

__all__ = ["Replication", "warning"]

#: synchronous_commit values under which a commit waits for the synchronous standbys.
_WAITING = ("on", "remote_write", "remote_apply")


@dataclasses.dataclass(frozen=True, slots=True)
class Replication:
    """How the journal's server replicates its commits, as its sessions see it.

    ``sync_standbys``: the standbys ``pg_stat_replication`` reports as synchronous now
    (``sync`` or ``quorum``); it shows them only to superusers and roles with the privileges
    of ``pg_read_all_stats``, so it is None where the role may not see them.
    """

    synchronous_commit: str
    synchronous_standby_names: str
    sync_standbys: int | None
    in_recovery: bool

    @property
    def waits_for_standby(self) -> bool:
        """Whether a commit returns only once a synchronous standby has it."""
        named = self.synchronous_standby_names.strip() not in ("", "''")
        return named and self.synchronous_commit in _WAITING


def warning(facts: Replication | None, effects: Iterable[Effect]) -> str | None:
    """One line saying what a failover of the journal's server would do to ``effects``, or
    None: for a journal that is not on PostgreSQL (``facts`` None), a server whose commits
    wait for a synchronous standby that is streaming, or effects that all deduplicate."""
    if facts is None or facts.in_recovery:
        return None
    at_risk = [e for e in effects if not e.policy.idempotent]
    if not at_risk:
        return None
    if not facts.waits_for_standby:
        why = (
            "the journal's PostgreSQL server commits without waiting for a synchronous standby "
            f"(synchronous_commit={facts.synchronous_commit}, synchronous_standby_names="
            f"{facts.synchronous_standby_names!r}): a failover to a standby loses the commits "
            "it had not received yet"
        )
    elif facts.sync_standbys == 0:
        why = (
            "the journal's PostgreSQL server names synchronous standbys "
            f"({facts.synchronous_standby_names}) but pg_stat_replication shows none streaming "
            "now: commits wait until one connects, and lowering synchronous_commit to stop "
            "the wait would let a failover lose them"
        )
    else:
        return None
    neither = [e.name for e in at_risk if not e.policy.can_reconcile]
    asked = [e.name for e in at_risk if e.policy.can_reconcile]
    parts = []
    if neither:
        parts.append(
            f"{', '.join(neither)} (can neither deduplicate nor be asked: a lost receipt ends "
            "UNRESOLVED, a lost intent sends it again)"
        )
    if asked:
        parts.append(
            f"{', '.join(asked)} (can be asked but does not deduplicate: a lost intent sends "
            "it again)"
        )
    return (
        f"{why}. Effects that a lost commit can duplicate: {'; '.join(parts)}. Name a "
        "synchronous standby in synchronous_standby_names, or see 'Failover' in docs/deploy.md"
    )
