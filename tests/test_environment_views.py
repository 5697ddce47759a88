"""How issue 10's package changes are shown and kept: the card, the thread and the
terminal reports, the audit record of a snapshot, the run view, and `/vllm audit <run-id>`.
The change used here is the real one of tests/samples/uv_dry_run_torch_change.txt (uv
0.13.9, vLLM 0.32.0 -> 0.33.0 moving torch 2.13.0 -> 2.14.0)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest

from bot.audit.records import EnvironmentRecord, RunRecord
from bot.audit.store import AuditLog
from bot.audit.view import run_view, runs_json
from bot.cli.terminal import TerminalSink
from bot.core import events as ev
from bot.core.packages import (
    Change,
    EnvKind,
    PackageDiff,
    Restoration,
    change_report,
    parse_freeze,
    parse_install_changes,
    planned_diff,
)
from bot.core.plan import make_plan
from bot.core.status import Action, RunStatus, Source
from bot.engine.audit_sink import environment_json
from bot.engine.preview import HostPreview, preview_json, preview_lines, previews_of
from bot.errors import InputError
from bot.settings import Settings
from bot.slack.blocks import CardView, run_card
from bot.slack.grammar import Audit, parse_command

SAMPLES = Path(__file__).parent / "samples"
BEFORE = parse_freeze((SAMPLES / "uv_pip_freeze_vllm_0.32.0.txt").read_text())
DIFF = planned_diff(
    BEFORE, parse_install_changes((SAMPLES / "uv_dry_run_torch_change.txt").read_text())
)
NONE = PackageDiff((), 197).to_json()  # the freeze equals the snapshot again


def settings(**services: Any) -> Settings:
    svc = {"hosts": ["h1"], "unit": "vllm-a", "python": "/opt/venvs/vllm/bin/python"}
    return Settings(
        hosts={"h1": {"address": "10.0.0.1", "known_hosts": "/tmp/kh"}},
        services={"qwen3": svc, **{n: svc for n in services}},
    )


def test_card_shows_the_torch_change_highlighted_before_approval() -> None:
    plan = make_plan(settings(), Action.REDEPLOY, "qwen3", version="0.33.0")
    view = CardView(
        run_id=7,
        plan=plan,
        requested_by="U1",
        status=RunStatus.PENDING_APPROVAL,
        packages=tuple(preview_lines((HostPreview("h1", DIFF),), limit=25)),
    )
    text = str(run_card(view).blocks)
    assert "*Package changes (dry run at request)*" in text
    assert "Also changes *torch 2.13.0 → 2.14.0*, *vllm 0.32.0 → 0.33.0*" in text
    assert "! nvidia-cudnn-cu13 9.20.0.48 → 9.24.0.43" in text
    assert "  orjson (new) 3.13.0" in text and "188 other packages unchanged" in text
    # The build the index resolved, beside the highlighted changes.
    assert "CUDA build: *torch 2.14.0 (CUDA 13.0, from cuda-toolkit 13.0.3.0)*" in text
    # Once approved, the card is a status card: the change is in the thread from then on.
    running = str(run_card(dataclasses.replace(view, status=RunStatus.RUNNING)).blocks)
    assert "Package changes" not in running


def test_the_card_names_each_cuda_build_the_hosts_resolved() -> None:
    """One host resolved PyPI's default (CUDA 13: the real dry run of vLLM 0.31.0), the
    other the cu129 build (its label, as PyTorch's cu129 index serves it)."""
    fresh = planned_diff(
        parse_freeze(""),
        parse_install_changes((SAMPLES / "uv_dry_run_vllm_0.31.0_cuda13.txt").read_text()),
    )
    cu129 = dataclasses.replace(fresh, build="torch 2.13.0+cu129 (CUDA 12.9, cu129 build)")
    view = CardView(
        run_id=8,
        plan=make_plan(settings(), Action.REDEPLOY, "qwen3", version="0.31.0"),
        requested_by="U1",
        status=RunStatus.PENDING_APPROVAL,
        packages=tuple(preview_lines((HostPreview("h1", fresh), HostPreview("h2", cu129)))),
    )
    text = str(run_card(view).blocks)
    assert (
        "CUDA build: *torch 2.13.0 (CUDA 13.0, from cuda-toolkit 13.0.3.0)*; "
        "*torch 2.13.0+cu129 (CUDA 12.9, cu129 build)*"
    ) in text


def test_preview_lines_group_hosts_and_say_which_could_not_be_read() -> None:
    same = preview_lines((HostPreview("h1", DIFF), HostPreview("h2", DIFF)))
    assert same[0].startswith("! torch") and "on h1" not in " ".join(same)
    mixed = preview_lines(
        (HostPreview("h1", DIFF), HostPreview("h2", None, "cannot reach h2 over SSH"))
    )
    assert mixed[0] == (
        "h2: could not be read (cannot reach h2 over SSH); the preflight "
        "reads it again before anything changes"
    )
    assert mixed[1] == "on h1:"
    stored = [
        EnvironmentRecord(1, 1, p.host, "preview", "t", preview_json(p))
        for p in (HostPreview("h1", DIFF), HostPreview("h2", None, "no answer"))
    ]
    assert previews_of(stored) == (HostPreview("h1", DIFF), HostPreview("h2", None, "no answer"))


def test_reports_for_the_thread_and_the_terminal() -> None:
    made = change_report(EnvKind.INSTALLED, DIFF)
    assert made is not None and made.splitlines()[:2] == [
        "Package changes the install made:",
        "! torch 2.13.0 → 2.14.0",
    ]
    assert change_report(EnvKind.RESTORED, PackageDiff((), 197)) == (
        "Environment after the rollback: equals the snapshot, every package as it was"
    )
    assert "DIFFERS from the snapshot" in (change_report(EnvKind.RESTORED, DIFF) or "")
    assert change_report(EnvKind.INSTALLED, None, "exit 2") == (
        "Package changes the install made: unknown (exit 2)"
    )
    assert change_report(EnvKind.SNAPSHOT, None) is None


async def test_terminal_prints_the_change_per_host() -> None:
    out = io.StringIO()
    await TerminalSink(out).handle(ev.PackagesKnown(1, "gpu-1", EnvKind.PLANNED, DIFF))
    await TerminalSink(out).handle(
        ev.PackagesKnown(1, "gpu-1", EnvKind.SNAPSHOT, None, BEFORE.text, "/x")
    )
    lines = out.getvalue().splitlines()
    assert lines[0] == "[gpu-1] Package changes planned (dry run at preflight):"
    assert lines[1] == "[gpu-1] ! torch 2.13.0 → 2.14.0"
    assert lines[-1] == "[gpu-1]   188 other packages unchanged"  # the snapshot prints nothing


async def test_the_audit_keeps_a_snapshot_whole_through_redaction(tmp_path: Path) -> None:
    # A freeze as one text would lose pins to redaction (`tiktoken==0.12.0` reads like a
    # `token=` secret); kept as name -> version, every pin survives.
    text = "tiktoken==0.12.0\ntorch==2.13.0\n-e file:///src/plugin\n"
    data = environment_json(ev.PackagesKnown(1, "h1", EnvKind.SNAPSHOT, None, text, "/l"))
    from bot.core.redact import Redactor

    async with AuditLog.open(tmp_path / "a.db", redact=Redactor([])) as audit:
        plan = make_plan(settings(), Action.REDEPLOY, "qwen3")
        run_id = await audit.create_run(
            service="qwen3",
            action=Action.REDEPLOY,
            hosts=["h1"],
            requested_by="U1",
            source=Source.CLI,
            plan=plan.to_json(),
            package_spec=plan.spec,
        )
        await audit.add_environment(run_id, "h1", "snapshot", data)
        [kept] = await audit.environments(run_id)
    assert kept.data["freeze"] == {"tiktoken": "0.12.0", "torch": "2.13.0"}
    assert kept.data["others"] == ["-e file:///src/plugin"]
    assert kept.data["sha256"] == parse_freeze(text).digest and kept.data["lock"] == "/l"


async def test_restorations_judge_the_host_whose_install_packages_changed_reports(
    tmp_path: Path,
) -> None:
    from bot.core.redact import Redactor

    moved = PackageDiff((Change("torch", "2.13.0", "2.14.0"),), 197).to_json()
    async with AuditLog.open(tmp_path / "a.db", redact=Redactor([])) as audit:
        plan = make_plan(settings(), Action.REDEPLOY, "qwen3")

        async def run(*records: tuple[str, str, dict[str, Any]]) -> int:
            run_id = await audit.create_run(
                service="qwen3",
                action=Action.REDEPLOY,
                hosts=["h1", "h2"],
                requested_by="U1",
                source=Source.CLI,
                plan=plan.to_json(),
                package_spec=plan.spec,
            )
            for host, kind, data in records:
                await audit.add_environment(run_id, host, kind, data)
            return run_id

        undone = await run(("h1", "installed", moved), ("h1", "restored", NONE))
        # h1's upgrade stayed; only h2 rolled back: what packages_changed shows still holds.
        other_host = await run(
            ("h1", "installed", moved), ("h2", "installed", moved), ("h2", "restored", NONE)
        )
        still = await run(("h1", "installed", moved), ("h1", "restored", moved))
        unread = await run(("h1", "installed", moved), ("h1", "restored", {"note": "exit 2"}))
        kept = await run(("h1", "installed", moved))
        ids = [undone, other_host, still, unread, kept]
        found = await audit.restorations(ids)
        records = await audit.list_runs()
        rows = {
            r["id"]: r
            for r in json.loads(runs_json(records, await audit.packages_changed(ids), found))
        }
    assert found == {
        undone: Restoration.EQUALS_SNAPSHOT,
        still: Restoration.DIFFERS_FROM_SNAPSHOT,
        unread: Restoration.UNKNOWN,
    }
    assert rows[undone]["environment_after_rollback"] == "equals_snapshot"
    assert rows[undone]["packages_changed"] == moved["changes"]  # kept, and said undone
    assert rows[other_host]["environment_after_rollback"] is None
    assert rows[kept]["environment_after_rollback"] is None


def test_run_view_prints_the_change_and_the_snapshot() -> None:
    record = RunRecord(
        id=12,
        service="qwen3",
        action=Action.REDEPLOY,
        hosts=["h1"],
        requested_by="U1",
        source=Source.CLI,
        status=RunStatus.ROLLED_BACK,
        current_step="postcheck",
        summary="the import gate refused the start",
        version_before="0.32.0",
        version_after="0.32.0",
        created_at="2026-11-30T10:00:00Z",
        started_at=None,
        finished_at=None,
        expires_at=None,
        channel=None,
        message_ts=None,
        plan={},
        package_spec="vllm==0.33.0",
        index_name=None,
        dry_run=False,
        approved_by=["U2"],
        denied_by=[],
    )
    envs = [
        EnvironmentRecord(
            1,
            12,
            "h1",
            "snapshot",
            "t",
            {"freeze": {"a": "1", "b": "2"}, "lock": "/opt/.chatops/x"},
        ),
        EnvironmentRecord(2, 12, "h1", "installed", "t", DIFF.to_json()),
        EnvironmentRecord(3, 12, "h1", "restored", "t", PackageDiff((), 197).to_json()),
    ]
    text = run_view(record, [], envs)
    assert text.splitlines()[0] == "run #12: redeploy qwen3 on h1: rolled_back"
    assert "h1: environment snapshot of 2 packages, kept on the host as /opt/.chatops/x" in text
    # The install's change is read with what became of it: the rollback undid it.
    assert (
        "h1: Package changes the install made (undone: the rollback restored the "
        "snapshot):\n    ! torch 2.13.0 → 2.14.0"
    ) in text
    assert "h1: After the rollback, compared with the snapshot: equals the snapshot" in text
    # A rollback that left a package moved says so where the install's change is read.
    envs[2] = EnvironmentRecord(3, 12, "h1", "restored", "t", DIFF.to_json())
    assert (
        "h1: Package changes the install made (a rollback ran, but the environment "
        "still DIFFERS from the snapshot):"
    ) in run_view(record, [], envs)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("audit #12", Audit(None, 20, 12)),
        ("audit 12", Audit(None, 20, 12)),
        ("audit 12 --limit 5", Audit(None, 5, 12)),
        ("audit qwen3", Audit("qwen3", 20)),
        ("audit 7", Audit("7", 20)),  # a service named 7 wins over run #7; "#7" is the run
        ("audit #7", Audit(None, 20, 7)),
    ],
)
def test_audit_takes_a_run_id(text: str, expected: Audit) -> None:
    assert parse_command(text, settings(**{"7": True})) == expected


def test_audit_refuses_what_is_neither() -> None:
    with pytest.raises(InputError):
        parse_command("audit #0", settings())
