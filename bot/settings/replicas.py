"""``[replicas]``: the timings of several replicas of the bot on one PostgreSQL database
(issue 21). Every key is optional; the defaults suit replicas on separate VMs.

::

    [replicas]
    lease_s = 30          # a driving replica's lease on its run
    renew_every_s = 5     # its heartbeat renews it this often
    leader_ttl_s = 10     # the leader's lease (the sweeps and the scheduled starts)
    sweep_every_s = 5     # the leader's recovery sweep (default: 5 on PostgreSQL, 60 on SQLite)

A replica that dies is noticed by the leader's sweep once its lease has run out: within
``lease_s + sweep_every_s`` of its last heartbeat, by the database's clock. A lease
renewed three times per length rides out a slow write or two; a shorter lease notices
a dead replica sooner and a slow one wrongly sooner.

Fencing ends at the bot: a driver asks its lease before each action on a host, and the
command reaches the host later, after an SSH connect (up to the host's
``connect_timeout_s``) and the command's start. So a driver counts its lease as over a
margin sooner than the database does (``Settings.lease_margin_s``): the longest SSH
connect timeout plus ``COMMAND_START_S``. A lease no longer than that margin could run
out between the ask and the command, so the settings refuse it.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from bot.settings.base import Section

# The sweep's period when none is set: often on PostgreSQL, where a replica's run waits
# for it to be recovered; once a minute on SQLite, where a request meeting the run's
# locks recovers it anyway and only a crashed CLI's run waits for the sweep.
SWEEP_EVERY_S_POSTGRES = 5.0
SWEEP_EVERY_S_SQLITE = 60.0
# A command's start on an open SSH connection (its session opened, sudo, the exec) and the
# renewal's way to the database: milliseconds on a LAN, so this leaves room for a loaded
# bot. The lease margin is the longest SSH connect timeout plus this.
COMMAND_START_S = 2.0


def lease_margin_for(connect_timeout_s: float) -> float:
    """How much sooner than the database a driver counts its lease as over: time for an
    SSH connect that takes its whole timeout and then the command's start."""
    return connect_timeout_s + COMMAND_START_S


class ReplicaSettings(Section):
    lease_s: float = Field(30.0, gt=0)
    renew_every_s: float = Field(5.0, gt=0)
    leader_ttl_s: float = Field(10.0, gt=0)
    sweep_every_s: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _renewed_in_time(self) -> ReplicaSettings:
        if self.renew_every_s * 3 > self.lease_s:
            raise ValueError(
                f"replicas.renew_every_s ({self.renew_every_s:g}) must be at most a third "
                f"of replicas.lease_s ({self.lease_s:g}): a live replica that misses one "
                "renewal would lose its run"
            )
        return self

    def sweep_s(self, *, postgres: bool) -> float:
        if self.sweep_every_s is not None:
            return self.sweep_every_s
        return SWEEP_EVERY_S_POSTGRES if postgres else SWEEP_EVERY_S_SQLITE
