"""An approved plan binds where each host's commands go: address, port, user, key path,
and the host key its known_hosts file trusts (issue 9's review: re-pointing a host
between request and execution went unnoticed, as the plan recorded host names only).
Any change refuses the run, with a refusals row, before anything reaches a host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncssh
import pytest

from bot.audit.store import RunRecord
from bot.core import events as ev
from bot.core.plan import UNKNOWN_HOST_KEY, make_plan
from bot.core.plan_drift import drift
from bot.core.status import Action, RunStatus, Source
from bot.engine.runtime import open_runtime
from bot.hosts.known_hosts import host_key_of, host_keys
from bot.settings import HostSettings
from bot.sim.kit import SERVICE, SimKit
from bot.slack.cards import plan_from_record
from tests.slack_harness import ALICE, BOB
from tests.support.host_keys import key_line, keygen_fingerprint
from tests.support.mock_host import MockHost, mock_host, mock_runtime, mock_settings
from tests.support.sim import sim_settings


class Quiet:
    async def handle(self, event: ev.Event) -> None:
        pass


async def _approved(kit: SimKit, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        record = await rt.lifecycle.request(
            rt.engine.plan(Action.RESTART, SERVICE), requested_by=ALICE, source=Source.CLI
        )
        assert await rt.lifecycle.confirm(record.id, BOB)
        return record.id, record.plan


async def test_the_plan_binds_each_hosts_address_port_user_key_and_host_key(
    sim_host: SimKit, tmp_path: Path
) -> None:
    run_id, stored = await _approved(sim_host, tmp_path)
    # The same fingerprint as OpenSSH's own tool prints for the kit's known_hosts file.
    assert stored["targets"] == [
        {
            "host": sim_host.hostname,
            "address": "127.0.0.1",
            "port": sim_host.port,
            "user": sim_host.user,
            "key_file": str(sim_host.client_key),
            "host_key": keygen_fingerprint(sim_host.known_hosts),
        }
    ]
    # Unchanged, it runs.
    async with open_runtime(sim_settings(sim_host, tmp_path)) as rt:
        result = await rt.engine.execute(run_id, Quiet())
        assert result.status == "succeeded", result.summary
        assert await rt.audit.refusals() == []


async def _approved_mock(host: MockHost, tmp_path: Path) -> int:
    async with mock_runtime(mock_settings(host, tmp_path), host) as rt:
        record = await rt.lifecycle.request(
            rt.engine.plan(Action.RESTART, SERVICE), requested_by=ALICE, source=Source.CLI
        )
        assert await rt.lifecycle.confirm(record.id, BOB)
        return record.id


# The refusals below reach no host, so a scripted one stands for it: any command or
# request it saw (not even a read) fails the test.


@pytest.mark.parametrize(
    "change",
    [
        {"port": 1},
        {"user": "someone-else"},
        {"address": "localhost"},
        {"key_file": "/etc/chatops/another_key"},
    ],
)
async def test_a_host_repointed_after_approval_is_refused(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    host = mock_host(tmp_path / "host")
    run_id = await _approved_mock(host, tmp_path)
    # The operator edits the host's entry and the bot restarts before the run starts.
    async with mock_runtime(mock_settings(host, tmp_path, host_overrides=change), host) as rt:
        result = await rt.engine.execute(run_id, Quiet())
        assert result.status == "refused"
        assert "the configuration changed since this plan was approved" in result.summary
        ((name, value),) = change.items()
        assert f"{host.hostname} {name.replace('_', ' ')}: " in result.summary
        assert f"→ {value}" in result.summary
        run = await rt.audit.get_run(run_id)
        assert run.status == "refused"
        rows = await rt.audit.refusals()
        assert [r.user for r in rows] == [ALICE] and "configuration changed" in rows[0].reason
        assert await rt.audit.lock_holder(f"service:{SERVICE}") is None
    assert host.untouched()


async def test_a_host_key_swapped_in_known_hosts_after_approval_is_refused(tmp_path: Path) -> None:
    # No restart: known_hosts is read at each connection, so the same bot would talk to
    # the machine behind the new key. The approval was for the old one.
    host = mock_host(tmp_path / "host")
    async with mock_runtime(mock_settings(host, tmp_path), host) as rt:
        record = await rt.lifecycle.request(
            rt.engine.plan(Action.RESTART, SERVICE), requested_by=ALICE, source=Source.CLI
        )
        assert await rt.lifecycle.confirm(record.id, BOB)
        before = keygen_fingerprint(host.known_hosts)
        host.known_hosts.write_text(key_line(host.port))
        after = keygen_fingerprint(host.known_hosts)
        result = await rt.engine.execute(record.id, Quiet())
        assert result.status == "refused"
        assert f"{host.hostname} host key: {before} → {after}" in result.summary
        assert len(await rt.audit.refusals()) == 1
    assert host.untouched()


async def test_a_missing_known_hosts_entry_binds_unknown_and_adding_it_is_a_change(
    tmp_path: Path,
) -> None:
    host = mock_host(tmp_path / "host")
    line = host.known_hosts.read_text()
    host.known_hosts.write_text("# nothing for this host yet\n")
    async with mock_runtime(mock_settings(host, tmp_path), host) as rt:
        record = await rt.lifecycle.request(
            rt.engine.plan(Action.RESTART, SERVICE), requested_by=ALICE, source=Source.CLI
        )
        assert record.plan["targets"][0]["host_key"] == UNKNOWN_HOST_KEY
        assert await rt.lifecycle.confirm(record.id, BOB)
        host.known_hosts.write_text(line)
        result = await rt.engine.execute(record.id, Quiet())
        assert result.status == "refused"
        assert f"host key: {UNKNOWN_HOST_KEY} → SHA256:" in result.summary
    assert host.untouched()


def test_host_keys_are_read_as_ssh_matches_them(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    a, b = (asyncssh.generate_private_key("ssh-ed25519") for _ in range(2))
    rsa = asyncssh.generate_private_key("ssh-rsa", key_size=2048)
    known.write_text(
        f"[10.0.0.1]:2222 {a.export_public_key().decode()}"
        # Port 22 entries carry no brackets; a host may have several keys.
        f"10.0.0.1 {b.export_public_key().decode()}"
        f"10.0.0.1 {rsa.export_public_key().decode()}"
        f"@revoked 10.0.0.2 {b.export_public_key().decode()}"
        f"10.0.0.2 {b.export_public_key().decode()}"
    )

    def key(**host: Any) -> str:
        return host_key_of(HostSettings(known_hosts=known, **host))

    assert key(address="10.0.0.1", port=2222) == a.get_fingerprint("sha256")
    assert key(address="10.0.0.1") == ",".join(
        sorted([b.get_fingerprint("sha256"), rsa.get_fingerprint("sha256")])
    )
    assert key(address="10.0.0.2") == UNKNOWN_HOST_KEY  # its only key is revoked
    assert key(address="gpu-9.example") == UNKNOWN_HOST_KEY
    assert (
        host_key_of(HostSettings(address="10.0.0.1", known_hosts=tmp_path / "missing"))
        == UNKNOWN_HOST_KEY
    )


def test_the_stored_plan_with_its_targets_round_trips(tmp_path: Path) -> None:
    host = mock_host(tmp_path / "host")
    settings = mock_settings(host, tmp_path)
    # As the engine builds it: the keys read at the edge, the plan pure.
    built = make_plan(
        settings, Action.REDEPLOY, SERVICE, host_keys=host_keys(settings, [host.hostname])
    )
    assert built.targets[0].host_key.startswith("SHA256:")
    record = RunRecord(
        id=1,
        service=SERVICE,
        action=Action.REDEPLOY,
        hosts=list(built.hosts),
        requested_by=ALICE,
        source=Source.SLACK,
        status=RunStatus.PENDING_APPROVAL,
        current_step=None,
        summary=None,
        version_before=None,
        version_after=None,
        created_at="",
        started_at=None,
        finished_at=None,
        expires_at=None,
        channel=None,
        message_ts=None,
        plan=built.to_json(),
        package_spec=built.spec,
        index_name=None,
        dry_run=False,
        approved_by=[],
        denied_by=[],
    )
    assert plan_from_record(record) == built


def test_drift_names_what_changed() -> None:
    target = {
        "host": "g1",
        "address": "10.0.0.1",
        "port": 22,
        "user": "root",
        "key_file": None,
        "host_key": "SHA256:a",
    }
    approved = {
        "unit": "u",
        "steps": [{"step": "stop", "command": "x"}],
        "targets": [target],
        "index_url": "https://user:token@a.example/simple",
    }
    now = {
        "unit": "v",
        "steps": [{"step": "stop", "command": "y"}],
        "index_url": "https://user:token@b.example/simple",
        "targets": [{**target, "port": 2222, "host_key": "SHA256:b"}, {**target, "host": "g2"}],
    }
    assert drift(approved, now, limit=10) == (
        "g1 port: 22 → 2222; g1 host key: SHA256:a → SHA256:b; host g2 added; "
        "index url; steps; unit: u → v"
    )  # an index URL may hold credentials: named only
    assert drift(approved, now, limit=2).endswith("; and 4 more")
    assert drift(approved, approved) == "no difference found"
