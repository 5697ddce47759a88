"""Issue 10 end to end: the engine against the simulated host behind a real OpenSSH sshd,
with the real audit database. What reached the host is read from its own call log
(``SimKit.changes()``), and what its environment is from its own state, not from what
the engine meant to do."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

from bot.cli.terminal import TerminalSink
from bot.core import events as ev
from bot.core.packages import parse_freeze
from bot.core.plan import Step
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.engine import RunResult
from bot.engine.preview import preview, preview_lines, previews_of, record_previews
from bot.engine.runtime import Runtime, open_runtime
from bot.sim.kit import SERVICE, SimKit, fast_config
from bot.sim.state import DEFAULT_VERSION
from bot.slack.blocks import run_card
from bot.slack.cards import card_view
from tests.support.sim import MakeSimHost, sim_settings

NEW = "0.31.0"


class Tap:
    """The terminal's view (shown when a test fails) and hooks on step starts."""

    def __init__(self, out: io.StringIO) -> None:
        self.terminal = TerminalSink(out)
        self.on_start: dict[Step, Any] = {}

    async def handle(self, event: ev.Event) -> None:
        await self.terminal.handle(event)
        if isinstance(event, ev.StepStarted) and event.step in self.on_start:
            self.on_start.pop(event.step)()


async def redeploy(rt: Runtime, tap: Tap | None = None, **plan: Any) -> tuple[RunResult, str]:
    out = io.StringIO()
    tap = tap or Tap(out)
    tap.terminal.out = out
    p = rt.engine.plan(Action.REDEPLOY, SERVICE, **plan)
    record = await rt.lifecycle.request(p, requested_by="U0ALICE", source=Source.CLI)
    await rt.audit.record_decision(record.id, "U0BOB", Decision.APPROVE)
    assert await rt.audit.transition(
        record.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
    )
    return await rt.engine.execute(record.id, tap), out.getvalue()


def starts_after_rollback_only(kit: SimKit) -> bool:
    """Every `systemctl start` came after the rollback: the new environment never ran."""
    changes = kit.changes()
    return "rollback" in changes and "start" not in changes[: changes.index("rollback")]


async def test_the_card_lists_the_torch_change_before_approval(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        plan = rt.engine.plan(Action.REDEPLOY, SERVICE, version=NEW, index="nightly")
        previews = await preview(rt.settings, rt.pool, plan)
        record = await rt.lifecycle.request(plan, requested_by="U0ALICE", source=Source.SLACK)
        await record_previews(rt.audit, record.id, previews)
        # The card is rendered from what the audit log kept, as a refreshed card is.
        stored = previews_of(await rt.audit.environments(record.id))
        view = card_view(await rt.audit.get_run(record.id), rt.settings.policy)
        view = dataclasses.replace(view, packages=tuple(preview_lines(stored)))
        card = str(run_card(view).blocks)
    assert stored == previews and previews[0].diff is not None
    assert "Also changes *torch 2.12.1+cu129 → 2.13.0*, *vllm" in card  # in the sentence
    assert "! torch 2.12.1+cu129 → 2.13.0" in card and "! nvidia-cudnn-cu13 (new) 9.20.0.48" in card
    assert "36 other packages unchanged" in card
    # Reading it changed nothing on the host.
    assert sim_sshd_host.changes() == ["dry-run"]
    assert sim_sshd_host.environment()["torch"] == "2.12.1+cu129"


async def test_a_failed_reinstall_that_moved_torch_restores_the_exact_freeze(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    before = sim_sshd_host.environment()
    sim_sshd_host.set_faults(uv_fails_midway=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        assert result.status == RunStatus.ROLLED_BACK, out
        assert "the whole environment, 43 packages, as before" in result.summary
        assert sim_sshd_host.environment() == before  # every package, not only vllm
        assert sim_sshd_host.changes() == [
            "dry-run",
            "prefetch",
            "stop",
            "install",
            "rollback",
            "start",
        ]
        sync = next(c.argv for c in sim_sshd_host.calls() if c.argv[:3] == ("uv", "pip", "sync"))
        assert "--offline" in sync
        kinds = {e.kind: e for e in await rt.audit.environments(result.run_id)}
        # What the failure left behind is on record: torch moved, vllm gone.
        left = {c["name"]: c for c in kinds["installed"].data["changes"]}
        assert left["torch"]["after"] == "2.13.0" and left["vllm"]["after"] is None
        assert kinds["restored"].data["changes"] == []
        snapshot = kinds["snapshot"].data
        lock = Path(snapshot["lock"])
        kept = parse_freeze(lock.read_text())
        assert kept.versions == snapshot["freeze"] == before
        assert kept.digest == snapshot["sha256"] and snapshot["sha256"][:16] in lock.name
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
        assert "No space left on device" in steps["reinstall"].output_tail
        assert steps["postcheck"].status == "ok"
    assert "environment equals the snapshot (43 packages)" in out


async def test_the_rollback_comes_from_the_cache_when_the_index_dropped_the_old_build(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    before = sim_sshd_host.environment()
    sim_sshd_host.set_faults(uv_fails_midway=True, index_drops_old=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
    assert result.status == RunStatus.ROLLED_BACK, out
    assert sim_sshd_host.environment() == before
    assert before["vllm"] == DEFAULT_VERSION  # the nightly dev build the index no longer has
    syncs = [c.argv for c in sim_sshd_host.calls() if c.argv[:3] == ("uv", "pip", "sync")]
    assert len(syncs) == 1 and "--offline" in syncs[0]


async def test_without_the_old_build_anywhere_the_run_says_how_to_restore(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    sim_sshd_host.set_faults(uv_fails_midway=True, index_drops_old=True)
    with sim_sshd_host.store.transaction() as tx:  # `uv cache prune` ran meanwhile
        tx.state = dataclasses.replace(
            tx.state, cache=tuple(c for c in tx.state.cache if not c.startswith("torch=="))
        )
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
    assert result.status == RunStatus.FAILED, out
    assert (
        "The service is STOPPED; restore the snapshot with `uv pip sync --python" in result.summary
    )
    assert sim_sshd_host.changes()[-2:] == ["rollback", "rollback"]  # cache, then index
    assert sim_sshd_host.unit_state() == "inactive"


def never_stopped(kit: SimKit) -> bool:
    """The unit was never stopped (nor started): no such call in the host's log."""
    return not any(
        c.argv[:2] in (("systemctl", "stop"), ("systemctl", "start")) for c in kit.calls()
    )


def no_throwaway_venv(kit: SimKit) -> bool:
    """The prefetch's throwaway venv is gone (its trap removed it)."""
    return not list(kit.root.rglob("prefetch-*"))


async def test_torch_cuda_mismatch_is_refused_before_the_stop(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # Issue 20: the prefetch's throwaway venv holds the new build; its own interpreter
    # runs the import and CUDA gate before the stop, so torch 2.13.0 (CUDA 13.0) on a
    # 12.9 driver never costs an outage.
    before = sim_sshd_host.environment()
    sim_sshd_host.set_faults(torch_cuda_mismatch=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        assert result.status == RunStatus.ABORTED, out
        assert (
            "CUDA check failed: torch 2.13.0 is built for CUDA 13.0, newer than the 12.9 "
            "the driver supports"
        ) in result.summary
        # ... and names where the build for this driver comes from: the configured index.
        assert "the configured index `cu129` serves it: redeploy with `--index cu129`" in (
            result.summary
        )
        # Said as a refusal of the new build, not as a failed prefetch (it fetched fine).
        assert result.summary.startswith(
            "refused before the stop; service untouched: the new environment's import gate"
        ), result.summary
        assert sim_sshd_host.changes() == ["dry-run", "prefetch"]
        assert never_stopped(sim_sshd_host)
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
        assert "gate" not in steps and "stop" not in steps
        fetch = steps["prefetch"]
        assert fetch.status == "failed"
        assert 'chatops-gate {"vllm": "0.31.0", "torch": "2.13.0", "cuda": "13.0"}' in (
            fetch.output_tail
        )
        assert (await rt.audit.get_run(result.run_id)).status == RunStatus.ABORTED
    assert sim_sshd_host.environment() == before
    assert sim_sshd_host.unit_state() == "active"
    assert no_throwaway_venv(sim_sshd_host)


async def test_an_import_error_is_refused_before_the_stop(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    sim_sshd_host.set_faults(import_error=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        assert result.status == RunStatus.ABORTED, out
        assert "import check failed: import vllm, torch failed: ImportError:" in result.summary
        assert never_stopped(sim_sshd_host)
        fetch = next(s for s in await rt.audit.steps(result.run_id) if s.step == "prefetch")
        assert "undefined symbol: _ZN3c104cuda9SetDeviceEab" in fetch.output_tail
    assert sim_sshd_host.installed_version == DEFAULT_VERSION
    assert no_throwaway_venv(sim_sshd_host)


async def test_what_only_the_service_venv_breaks_is_caught_by_the_gate_after_the_install(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # A plugin the install leaves alone breaks the import: the throwaway venv lacks it,
    # so the pre-stop gate passes; the gate after the install (on the real venv) still
    # stops the new build from starting, and the snapshot comes back.
    before = sim_sshd_host.environment()
    sim_sshd_host.set_faults(stale_plugin=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        assert result.status == RunStatus.ROLLED_BACK, out
        assert "import check failed: import vllm, torch failed: ImportError:" in result.summary
        assert starts_after_rollback_only(sim_sshd_host)
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
        assert steps["prefetch"].status == "ok"
        assert "passed the import gate" in out
        assert "undefined symbol: _ZN3c104cuda9SetDeviceEab" in steps["gate"].output_tail
    assert sim_sshd_host.environment() == before
    assert sim_sshd_host.unit_state() == "active"


async def test_an_unhealthy_start_rolls_back_the_whole_environment(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    before = sim_sshd_host.environment()
    sim_sshd_host.set_faults(health_503=True)
    tap = Tap(io.StringIO())
    # The new version answers 503; the old one, once restored, is healthy again.
    tap.on_start[Step.ROLLBACK] = lambda: sim_sshd_host.set_faults(health_503=False)
    settings = sim_settings(sim_sshd_host, tmp_path, start_timeout_s=1.5)
    async with open_runtime(settings) as rt:
        result, out = await redeploy(rt, tap, version=NEW, index="nightly")
    assert result.status == RunStatus.ROLLED_BACK, out
    assert "HTTP 503" in result.summary
    assert sim_sshd_host.changes() == [
        "dry-run",
        "prefetch",
        "stop",
        "install",
        "start",
        "stop",
        "rollback",
        "start",
    ]
    assert sim_sshd_host.environment() == before


async def test_the_outage_contains_no_download(sim_sshd_host: SimKit, tmp_path: Path) -> None:
    cached = sim_sshd_host.cached()
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
    assert result.status == RunStatus.SUCCEEDED, out
    # Judged by what uv printed, not by durations (a loaded machine says more about itself
    # than about the install): the prefetch, before the stop, fetched the 13 changed
    # wheels (uv announces the 12 of 1 MiB or more; orjson is 0.9 MiB) ...
    announced = [
        line
        for line in steps["prefetch"].output_tail.splitlines()
        if line.startswith("Downloading ")
    ]
    assert len(announced) == 12 and "Downloading torch (880.0MiB)" in announced
    # The unit's flags were judged against the new build's own help (issue 20).
    assert "every flag of the unit's ExecStart (4) is accepted by vllm 0.31.0" in out, out
    assert len(sim_sshd_host.cached() - cached) == 13
    # ... and the install in the outage fetched nothing.
    assert "Downloading" not in steps["reinstall"].output_tail
    calls = sim_sshd_host.calls()
    stop = next(i for i, c in enumerate(calls) if c.argv[:2] == ("systemctl", "stop"))
    prefetch = next(
        i
        for i, c in enumerate(calls)
        if c.argv[:3] == ("uv", "pip", "install") and str(sim_sshd_host.python) not in c.argv
    )
    assert prefetch < stop


async def test_a_flag_the_new_version_dropped_is_refused_before_the_stop(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # Issue 20: the unit passes `--task generate`; the new build's `vllm serve --help=all`
    # (run in the prefetch's throwaway venv) does not list it, so the run ends before
    # the stop instead of an outage, a start that exits with argparse's usage and a
    # rollback.
    sim_sshd_host.set_faults(removed_flag=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
    assert result.status == RunStatus.ABORTED, out
    assert result.summary.startswith(
        "refused before the stop; service untouched: `--task` is not accepted by vllm 0.31.0"
    ), result.summary
    assert steps["prefetch"].status == "failed" and "refuses the unit's flags" in out
    assert sim_sshd_host.changes() == ["dry-run", "prefetch"]
    assert never_stopped(sim_sshd_host)
    assert sim_sshd_host.installed_version == DEFAULT_VERSION
    assert sim_sshd_host.unit_state() == "active"
    assert no_throwaway_venv(sim_sshd_host)
    # The help it judged by is the grouped one's full list (`--help=all`), not the summary.
    help_runs = [c.argv for c in sim_sshd_host.calls() if c.argv[:1] == ("venv-vllm",)]
    assert [a[2:] for a in help_runs] == [("serve", "--help=all")]


async def test_a_wrapper_unit_is_said_unchecked_never_passed(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # A unit that starts a script: its flags cannot be read, so the prefetch says so (a
    # warning, not a pass) and goes on; here the build does drop the flag the script
    # passes, the start fails as argparse makes it, and the rollback brings the old
    # build back: what the check spares a unit it can read.
    kit = await make_sim_host(
        access="sshd", config=fast_config(exec_wrapper=("/usr/local/bin/start-vllm.sh",))
    )
    kit.set_faults(removed_flag=True)
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
    assert steps["prefetch"].status == "ok", out
    assert "every flag of the unit's ExecStart" not in out
    assert (
        "the unit's flags were not checked: the unit does not start `vllm serve` directly "
        "(ExecStart: /usr/local/bin/start-vllm.sh)"
    ) in out, out
    assert not any(c.argv[:1] == ("venv-vllm",) for c in kit.calls())
    assert result.status == RunStatus.ROLLED_BACK, out
    assert "unrecognized arguments: --task generate" in out
    assert kit.installed_version == DEFAULT_VERSION and kit.unit_state() == "active"


async def test_a_snapshot_that_cannot_be_saved_refuses_before_the_stop(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # Where the snapshot goes is taken by a file: `mkdir -p` fails on the host.
    (sim_sshd_host.venv_dir.parent / ".chatops").write_text("not a directory\n")
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW)
    assert result.status == RunStatus.ABORTED, out
    assert "cannot save the environment snapshot on the host" in result.summary
    assert "File exists" in result.summary or "Not a directory" in result.summary
    assert sim_sshd_host.changes() == ["dry-run"]
    assert sim_sshd_host.unit_state() == "active"


async def test_audit_json_and_run_view_show_the_change(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    from bot.audit.view import run_view, runs_json

    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        assert result.status == RunStatus.SUCCEEDED, out
        records = await rt.audit.list_runs()
        text = runs_json(records, await rt.audit.packages_changed([r.id for r in records]))
        view = run_view(
            records[0],
            await rt.audit.steps(result.run_id),
            await rt.audit.environments(result.run_id),
        )
    assert '"name": "torch",\n        "before": "2.12.1+cu129",\n        "after": "2.13.0"' in text
    assert "Package changes the install made:" in view and "! torch 2.12.1+cu129 → 2.13.0" in view
    assert "environment snapshot of 43 packages, kept on the host as" in view


async def test_a_download_that_fails_before_the_stop_leaves_the_service_untouched(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    sim_sshd_host.set_faults(prefetch_fails=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
    assert result.status == RunStatus.ABORTED, out
    assert result.summary.startswith("prefetch failed; service untouched: prefetch failed (exit 2)")
    assert steps["prefetch"].status == "failed"
    assert "Failed to download" in steps["prefetch"].output_tail
    assert sim_sshd_host.changes() == ["dry-run", "prefetch"]
    assert sim_sshd_host.unit_state() == "active"
    assert sim_sshd_host.environment()["torch"] == "2.12.1+cu129"


# ---- issue 17: CUDA minor versions, local version labels, a freeze listing one package twice


async def test_a_cu129_torch_on_a_driver_reporting_cuda_12_8_starts_with_a_warning(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # D2: CUDA minor-version compatibility runs a cu129 torch on a driver that reports
    # 12.8 (pytorch/pytorch#155141: cu128 on a 12.4 driver): a warning, not a rollback.
    sim_sshd_host.set_faults(cu129_on_cuda_12_8=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        gate = next(s for s in await rt.audit.steps(result.run_id) if s.step == "gate")
    assert result.status == RunStatus.SUCCEEDED, out
    assert sim_sshd_host.environment()["torch"] == "2.13.0+cu129"
    assert gate.status == "ok"
    warning = (
        "WARNING: torch's CUDA 12.9 is newer than the 12.8 the driver reports; it "
        "runs under CUDA minor-version compatibility"
    )
    assert warning in gate.output_tail and warning in out  # the step's output and its line
    assert sim_sshd_host.changes() == ["dry-run", "prefetch", "stop", "install", "start"]
    assert sim_sshd_host.unit_state() == "active"


async def test_a_cu13_torch_on_a_cuda_12_driver_still_never_starts(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # D2's other side: a newer major (torch 2.13.0 for CUDA 13.0 on a 12.9 driver) is no
    # minor-version case: refused before the stop (issue 20).
    sim_sshd_host.set_faults(torch_cuda_mismatch=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
    assert result.status == RunStatus.ABORTED, out
    assert "another major version" in result.summary
    assert never_stopped(sim_sshd_host)


async def test_the_index_a_refusal_names_serves_the_build_the_driver_runs(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # PyPI's default 0.31.0 is a CUDA 13 build (tests/samples/uv_dry_run_vllm_0.31.0_cuda13
    # .txt); on a 12.9 driver the gate refuses it and names the configured cu129 index
    # (PyTorch's download.pytorch.org/whl/cu129). Through that index the same release
    # resolves as its cu129 build, which the gate passes, the approvers are told so, and
    # it serves.
    sim_sshd_host.set_faults(torch_cuda_mismatch=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        refused, out = await redeploy(rt, version=NEW, index="nightly")
        assert refused.status == RunStatus.ABORTED, out
        assert "redeploy with `--index cu129`" in refused.summary
        assert "CUDA build: torch 2.13.0 (CUDA 13.0, from cuda-toolkit 13.0.3.0)" in out
        result, out = await redeploy(rt, version=NEW, index="cu129")
        gate = next(s for s in await rt.audit.steps(result.run_id) if s.step == "gate")
    assert result.status == RunStatus.SUCCEEDED, out
    assert "CUDA build: torch 2.13.0+cu129 (CUDA 12.9, cu129 build)" in out
    assert gate.status == "ok" and '"torch": "2.13.0+cu129", "cuda": "12.9"' in gate.output_tail
    assert "ok gate" in out and "driver supports CUDA 12.9" in out
    assert sim_sshd_host.installed_version == "0.31.0+cu129"
    assert sim_sshd_host.environment()["torch"] == "2.13.0+cu129"
    assert sim_sshd_host.unit_state() == "active"


async def test_a_cu129_wheel_whose_server_reports_no_label_is_the_version_asked_for(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # D3: uv installs vllm 0.31.0+cu129 (wheels.vllm.ai/<version>/cu129, vllm#43847);
    # vllm.__version__ and /version say 0.31.0 (setup.py appends the label to the wheel
    # only). Pinned: readiness compares /version with `uv pip show`.
    sim_sshd_host.set_faults(cu129_wheels=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
    assert result.status == RunStatus.SUCCEEDED, out
    assert sim_sshd_host.installed_version == "0.31.0+cu129"
    assert (
        "reports 0.31.0, the release of the installed 0.31.0+cu129"
        in steps["readiness"].output_tail
    )
    assert 'chatops-gate {"vllm": "0.31.0"' in steps["gate"].output_tail
    assert result.summary == f"vllm {DEFAULT_VERSION} -> 0.31.0+cu129, healthy"


async def test_latest_resolving_to_a_cu129_wheel_passes_the_import_gate(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # D3, unpinned: the target is what the dry run resolved (`+ vllm==0.31.0+cu129`), the
    # gate's interpreter says 0.31.0.
    sim_sshd_host.set_faults(cu129_wheels=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, index="nightly")
    assert result.status == RunStatus.SUCCEEDED, out
    assert "resolves to 0.31.0+cu129" in out
    assert sim_sshd_host.changes() == ["dry-run", "prefetch", "stop", "install", "start"]


async def test_a_venv_with_two_dist_infos_of_one_package_refuses_before_the_stop(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # D7: the freeze lists pip twice (uv's freeze_duplicate test); `uv pip sync` of that
    # snapshot cannot resolve, so no rollback could work: refused, service untouched.
    sim_sshd_host.set_faults(duplicate_dist_info=True)
    async with open_runtime(sim_settings(sim_sshd_host, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
        refusal = await rt.audit.get_run(result.run_id)
    assert result.status == RunStatus.ABORTED, out
    assert (
        "preflight refused; service untouched: snapshot not restorable: two versions "
        "of pip installed (21.3.1, 22.1.1)"
    ) in result.summary
    assert refusal is not None and refusal.status == RunStatus.ABORTED
    assert sim_sshd_host.changes() == ["dry-run"]
    assert sim_sshd_host.unit_state() == "active"
