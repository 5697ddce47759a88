"""Issue 10's steps of the redeploy flow, driven by hand-made outcomes (no I/O): the
environment snapshot, the prefetch before the stop, the import gate before the start,
and the rollback of the whole environment."""

from __future__ import annotations

import dataclasses
from typing import Any

from bot.core import remote
from bot.core.cuda import GATE_CODE
from bot.core.flows import EndStep, Packages
from bot.core.packages import Change, EnvKind
from bot.core.plan import Step
from bot.core.unit_flags import HELP_BEGIN, HELP_END, HELP_FAILED
from bot.hosts.base import CommandResult
from tests.test_sequence import Host, is_rollback, ok, run, steps, verbs

OLD = "0.16.0rc2.dev313+g662205d34"


def packages(h: Host, kind: EnvKind) -> list[Packages]:
    return [n for n in h.notices if isinstance(n, Packages) and n.kind == kind]


def ended(h: Host, step: Step) -> EndStep:
    return next(n for n in h.notices if isinstance(n, EndStep) and n.step == step)


def start_after_rollback_only(h: Host) -> bool:
    """No `systemctl start` before the rollback: the new environment never started."""
    starts = [i for i, a in enumerate(h.calls) if a[:2] == ("systemctl", "start")]
    rollbacks = [i for i, a in enumerate(h.calls) if is_rollback(a)]
    return bool(starts) and bool(rollbacks) and min(starts) > max(rollbacks)


def test_preflight_records_the_snapshot_and_the_planned_change() -> None:
    h = Host()
    assert run(h, version="0.16.0").status == "succeeded"
    [snap] = packages(h, EnvKind.SNAPSHOT)
    assert snap.freeze == f"numpy==2.2.6\ntorch==2.9.1\nvllm=={OLD}\n"
    assert snap.lock is not None and snap.lock.startswith("/opt/venvs/.chatops/vllm-")
    save = next(a for a in h.calls if a[:2] == ("/bin/sh", "-c") and a[-1] == snap.lock)
    assert save[-2] == "/opt/venvs/.chatops"
    [planned] = packages(h, EnvKind.PLANNED)
    assert planned.diff is not None
    assert planned.diff.changes == (
        Change("torch", "2.9.1", "2.10.0"),
        Change("vllm", OLD, "0.16.0"),
    )
    assert planned.diff.unchanged == 1  # numpy, reinstalled as it was (`~`)
    assert "changes: torch 2.9.1 → 2.10.0, vllm" in ended(h, Step.PREFLIGHT).summary
    [installed] = packages(h, EnvKind.INSTALLED)
    assert installed.diff is not None and installed.diff.changes == planned.diff.changes


def test_a_dry_run_reports_the_change_and_writes_nothing() -> None:
    h = Host()
    out = run(h, version="0.16.0", dry_run=True)
    assert out.status == "succeeded"
    assert "torch 2.9.1 → 2.10.0" in out.summary
    assert not any(a[:2] == ("/bin/sh", "-c") for a in h.calls)  # no snapshot saved, no prefetch
    assert packages(h, EnvKind.SNAPSHOT)[0].lock is None


def _refuses(h: Host, needle: str) -> None:
    out = run(h)
    assert out.status == "aborted", out.summary
    assert needle in out.summary and "service untouched" in out.summary
    assert verbs(h) == [] and not any(a[:2] == ("systemctl", "stop") for a in h.calls)


def test_a_snapshot_that_cannot_be_taken_refuses_before_the_stop() -> None:
    h = Host(freeze_ok=False)
    _refuses(h, "cannot take the environment snapshot")
    assert steps(h) == [("preflight", False)]


def test_a_snapshot_that_cannot_be_saved_refuses_before_the_stop() -> None:
    h = Host(save_ok=False)
    _refuses(h, "cannot save the environment snapshot on the host")
    assert "Read-only file system" in run(Host(save_ok=False)).summary


def test_an_empty_snapshot_refuses() -> None:
    h = Host()
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        return ok(a, "") if a[1:3] == ("pip", "freeze") else inner(a)

    h.command = command  # type: ignore[method-assign]
    _refuses(h, "the environment snapshot is empty")


def test_prefetch_runs_before_the_stop_with_the_pinned_set_on_stdin() -> None:
    h = Host()
    assert run(h, version="0.16.0", index="nightly").status == "succeeded"
    names = [str(n.step) for n in h.notices if isinstance(n, EndStep)]
    assert names.index("prefetch") < names.index("stop")
    fetched = ended(h, Step.PREFETCH)
    assert fetched.ok and "3 packages in uv's cache, 880.0 MiB downloaded" in fetched.summary
    prefetch = next(a for a, _ in h.index_env if a[:2] == ("/bin/sh", "-c") and "venv" in a[2])
    assert prefetch[-6:] == (
        "/opt/venvs/.chatops/prefetch-vllm",
        "uv",
        "/opt/venvs/vllm/bin/python",
        "300",  # gate_timeout_s, then the gate run in the throwaway venv (issue 20)
        GATE_CODE,
        # This host's `systemctl show` has no ExecStart: no help to list (unchecked).
        "none",
    )


def test_prefetch_stdin_is_the_index_then_the_pins() -> None:
    seen: list[bytes] = []
    h = Host()
    respond = h.respond

    def spy(action: Any) -> Any:
        argv = getattr(action, "argv", None) or ()
        if getattr(action, "step", None) == Step.PREFETCH and remote.PREFETCH_SCRIPT in argv:
            seen.append(action.stdin)
        return respond(action)

    h.respond = spy  # type: ignore[method-assign]
    run(h, version="0.16.0", index="nightly")
    assert seen == [b"https://wheels.vllm.ai/nightly\nnumpy==2.2.6\ntorch==2.10.0\nvllm==0.16.0\n"]


def test_a_failed_prefetch_refuses_with_the_service_untouched() -> None:
    h = Host(prefetch_ok=False)
    out = run(h)
    assert out.status == "aborted"
    assert out.summary.startswith("prefetch failed; service untouched: prefetch failed (exit 2)")
    assert "Failed to download `torch==2.10.0`" in out.summary
    assert verbs(h) == []


def test_a_freeze_listing_one_package_twice_refuses_before_anything_is_saved() -> None:
    # Issue 17 D7: what uv prints for a venv with two pip dist-infos
    # (tests/samples/uv_pip_freeze_duplicate_dist_info.txt), in a vLLM venv.
    h = Host()
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        if a[1:3] == ("pip", "freeze"):
            return ok(a, f"numpy==2.2.6\npip==21.3.1\npip==22.1.1\nvllm=={OLD}\n")
        return inner(a)

    h.command = command  # type: ignore[method-assign]
    _refuses(h, "snapshot not restorable: two versions of pip installed (21.3.1, 22.1.1)")
    assert not any(a[:3] == ("sh", "-c", remote.SAVE_FROM_STDIN) for a in h.calls)
    assert "pip==22.1.1" in ended(h, Step.PREFLIGHT).detail  # the freeze, as evidence


def test_prefetch_pins_a_package_from_a_url_by_its_url() -> None:
    # Issue 17 D8: the dry run installs a wheel from a direct URL (the line's form is real
    # uv's: tests/samples/uv_pip_install_direct_url.txt); the throwaway venv must get it
    # from there, as the install will (an index need not serve that build).
    url = "https://wheels.example.com/abc/humming_kernels-0.1.19-py3-none-any.whl"
    seen: list[bytes] = []
    h = Host()
    inner, respond = h.command, h.respond

    def command(a: tuple[str, ...]) -> CommandResult:
        r = inner(a)
        if "--dry-run" in a:
            return ok(a, stderr=r.stderr + f"\n + humming-kernels==0.1.19 (from {url})")
        return r

    def spy(action: Any) -> Any:
        argv = getattr(action, "argv", None) or ()
        if getattr(action, "step", None) == Step.PREFETCH and remote.PREFETCH_SCRIPT in argv:
            seen.append(action.stdin)
        return respond(action)

    h.command = command  # type: ignore[method-assign]
    h.respond = spy  # type: ignore[method-assign]
    assert run(h, version="0.16.0").status == "succeeded"
    assert seen == [
        f"humming-kernels @ {url}\nnumpy==2.2.6\ntorch==2.10.0\nvllm==0.16.0\n".encode()
    ]
    [planned] = packages(h, EnvKind.PLANNED)
    assert planned.diff is not None
    assert Change("humming-kernels", None, "0.1.19", None, url) in planned.diff.changes


def _gate_refuses(h: Host, check: str) -> str:
    out = run(h, version="0.16.0")
    assert out.status == "rolled_back", out.summary
    assert verbs(h) == ["stop", "install", "rollback", "start"]
    assert start_after_rollback_only(h)
    gate = ended(h, Step.GATE)
    assert not gate.ok and gate.summary.startswith(f"{check} check failed")
    assert f"the import gate refused the start ({check} check failed" in out.summary
    assert (
        "rolled back to 0.16.0rc2.dev313+g662205d34 (the whole environment, 3 packages"
        in out.summary
    )
    return out.summary


def test_an_import_error_never_starts_the_new_version() -> None:
    summary = _gate_refuses(Host(gate_exit=3, gate_stdout=""), "import")
    assert "ImportError: boom" in summary


def test_a_torch_built_for_a_newer_cuda_than_the_driver_never_starts() -> None:
    # Issue 20: the throwaway venv's gate refuses it before the stop.
    h = Host(driver_cuda="12.8")
    out = run(h, version="0.16.0", index="nightly")
    assert out.status == "aborted", out.summary
    assert "torch 2.10.0 is built for CUDA 13.0, newer than the 12.8 the driver supports" in (
        out.summary
    )
    assert verbs(h) == []


def test_another_vllm_than_the_target_never_starts() -> None:
    summary = _gate_refuses(
        Host(gate_stdout='chatops-gate {"vllm": "0.15.1", "torch": "2.10.0", "cuda": "13.0"}\n'),
        "vllm version",
    )
    assert "vllm 0.15.1 is installed, not 0.16.0" in summary


def test_rollback_tries_the_cache_first_then_the_index() -> None:
    h = Host(install_fails=1, sync_fails=1)
    out = run(h, version="0.16.0", index="nightly")
    assert out.status == "rolled_back", out.summary
    syncs = [a for a in h.calls if is_rollback(a)]
    assert len(syncs) == 2 and "--offline" in syncs[0] and "--offline" not in syncs[1]
    assert syncs[0][-1] == syncs[1][-1]  # the same snapshot
    assert (syncs[1], "https://wheels.vllm.ai/nightly") in h.index_env
    rollbacks = [n for n in h.notices if isinstance(n, EndStep) and n.step == Step.ROLLBACK]
    assert [r.ok for r in rollbacks] == [False, True]
    assert "from the index" in rollbacks[1].summary


def test_post_check_after_a_rollback_compares_the_freeze_with_the_snapshot() -> None:
    h = Host(install_fails=1)
    assert run(h).status == "rolled_back"
    post = ended(h, Step.POSTCHECK)
    assert post.ok and "environment equals the snapshot (3 packages)" in post.summary
    [restored] = packages(h, EnvKind.RESTORED)
    assert restored.diff is not None and restored.diff.changes == ()


def test_a_restored_environment_that_differs_is_a_failure_that_says_how() -> None:
    h = Host(install_fails=1)
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        r = inner(a)
        if is_rollback(a):
            h.torch = "2.10.0"  # uv left torch behind (it never does; the check must tell)
        return r

    h.command = command  # type: ignore[method-assign]
    out = run(h)
    assert out.status == "failed"
    assert "the environment DIFFERS from the snapshot: torch 2.9.1 → 2.10.0" in out.summary
    assert not ended(h, Step.POSTCHECK).ok


def _unhealthy_until_rollback(h: Host) -> Host:
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        if is_rollback(a):
            h.health_status = 200
        return inner(a)

    h.command = command  # type: ignore[method-assign]
    return h


def test_an_unhealthy_start_stops_and_restores_the_snapshot() -> None:
    h = _unhealthy_until_rollback(Host(health_status=503, drain_after_polls=0))
    out = run(h, version="0.16.0")
    assert out.status == "rolled_back", out.summary
    assert "not healthy after 30s (last: HTTP 503)" in out.summary
    assert verbs(h) == ["stop", "install", "start", "stop", "rollback", "start"]
    names = [str(n.step) for n in h.notices if isinstance(n, EndStep)]
    after = names[names.index("health") :]
    assert (
        after[:5] == ["health", "rollback_stop", "rollback", "rollback_start", "rollback_health"]
        and "postcheck" in after
    )


def test_rollback_on_unhealthy_off_ends_failed_with_the_exact_command() -> None:
    h = Host(health_status=503)
    out = run(h, svc={"rollback_on_unhealthy": False}, version="0.16.0")
    assert out.status == "failed"
    assert "rollback_on_unhealthy is off" in out.summary
    assert (
        "Roll back with: `systemctl stop --no-pager -- vllm-kimi-k25 && uv pip sync --python "
        "/opt/venvs/vllm/bin/python --offline /opt/venvs/.chatops/vllm-"
    ) in out.summary
    assert verbs(h) == ["stop", "install", "start"]


# Issue 20, item 2: the unit's flags, judged in the prefetch against the new version's
# own option lines (the format of tests/samples/vllm_help/, two spaces in).
EXEC_START = (
    "ExecStart={ path=/opt/venvs/vllm/bin/vllm ; argv[]=/opt/venvs/vllm/bin/vllm serve "
    "/models/Kimi-K2.5 --tensor-parallel-size 8 --max_model_len 65536 --task generate ; "
    "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; "
    "status=0/0 }\n"
)
HELP_LINES = [
    "  --port PORT           Port number. (default: 8000)",
    "  --max-model-len MAX_MODEL_LEN",
    "  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE",
]


def _unit_and_help(h: Host, section: list[str] | None) -> list[tuple[str, ...]]:
    """The unit's ExecStart, and ``section`` after the prefetch's output when it was
    asked for the help; returns the prefetch argvs seen."""
    inner, seen = h.command, []

    def command(a: tuple[str, ...]) -> CommandResult:
        if a[1:4] == ("show", "-p", "ExecStart"):
            return ok(a, EXEC_START)
        r = inner(a)
        if a[:2] == ("/bin/sh", "-c") and "venv" in a[2]:
            seen.append(a)
            if a[-1] == "serve" and section is not None:
                return dataclasses.replace(r, stdout=r.stdout + "".join(f"{s}\n" for s in section))
        return r

    h.command = command  # type: ignore[method-assign]
    return seen


def test_a_flag_the_new_help_lacks_refuses_before_the_stop() -> None:
    h = Host()
    seen = _unit_and_help(h, [HELP_BEGIN, *HELP_LINES, HELP_END])
    out = run(h, version="0.16.0")
    assert out.status == "aborted", out.summary
    assert out.summary == (
        "refused before the stop; service untouched: `--task` is not accepted by vllm "
        "0.16.0 (the unit's ExecStart passes it; change the unit first)"
    )
    assert [a[-1] for a in seen] == ["serve"]
    assert not any(a[:2] == ("systemctl", "stop") for a in h.calls)


def test_flags_the_new_help_lists_pass_and_are_said() -> None:
    h = Host()
    _unit_and_help(h, [HELP_BEGIN, *HELP_LINES, "  --task TASK", HELP_END])
    assert run(h, version="0.16.0").status == "succeeded"
    said = ended(h, Step.PREFETCH).summary
    assert "every flag of the unit's ExecStart (3) is accepted by vllm 0.16.0" in said


def test_a_help_that_failed_is_unchecked_and_the_run_goes_on() -> None:
    h = Host()
    _unit_and_help(h, [HELP_BEGIN, f"{HELP_FAILED} exit 124: "])
    assert run(h, version="0.16.0").status == "succeeded"
    fetched = ended(h, Step.PREFETCH)
    assert fetched.ok
    assert (
        "the unit's flags were not checked: `vllm serve --help` of the new version failed "
        "(exit 124:)"
    ) in fetched.summary
    assert "WARNING: the unit's flags were not checked" in fetched.detail


def test_a_prefetch_cut_before_the_help_ended_is_unchecked() -> None:
    h = Host()
    _unit_and_help(h, [HELP_BEGIN, *HELP_LINES])  # no end mark: the output was cut
    assert run(h, version="0.16.0").status == "succeeded"
    said = ended(h, Step.PREFETCH).summary
    assert "the new version's `vllm serve --help` did not come back whole" in said


# The unit's flags in `$VLLM_ARGS`: `systemctl show` prints ExecStart's `$` words as
# written and the environment in lines of their own (systemd 252's formatting:
# tests/samples/systemd_env/systemctl_show_exec_env_252.txt).
ENV_EXEC_START = (
    "ExecStart={ path=/opt/venvs/vllm/bin/vllm ; argv[]=/opt/venvs/vllm/bin/vllm serve "
    "/models/Kimi-K2.5 --tensor-parallel-size 8 $VLLM_ARGS ; ignore_errors=no ; "
    "start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n"
)


def _unit_with_env(
    h: Host, show: str, files: dict[str, CommandResult], section: list[str]
) -> list[tuple[str, ...]]:
    """A unit whose `systemctl show` prints ``show`` and whose EnvironmentFiles read as
    ``files`` say; returns the `cat` argvs seen."""
    inner, seen = h.command, []

    def command(a: tuple[str, ...]) -> CommandResult:
        if a[0] == "cat":
            seen.append(a)
            return dataclasses.replace(files[a[-1]], argv=a)
        if a[1:4] == ("show", "-p", "ExecStart"):
            return ok(a, show)
        r = inner(a)
        if a[:2] == ("/bin/sh", "-c") and "venv" in a[2] and a[-1] == "serve":
            return dataclasses.replace(r, stdout=r.stdout + "".join(f"{s}\n" for s in section))
        return r

    h.command = command  # type: ignore[method-assign]
    return seen


def test_a_removed_flag_inside_vllm_args_is_refused_before_the_stop() -> None:
    h = Host()
    show = ENV_EXEC_START + 'Environment="VLLM_ARGS=--max_model_len 65536 --task generate"\n'
    _unit_with_env(h, show, {}, [HELP_BEGIN, *HELP_LINES, HELP_END])
    out = run(h, version="0.16.0")
    assert out.status == "aborted", out.summary
    assert out.summary.startswith(
        "refused before the stop; service untouched: `--task` is not accepted by vllm 0.16.0"
    )
    assert not any(a[:2] == ("systemctl", "stop") for a in h.calls)


def test_an_environment_file_read_over_environment_sets_the_flags() -> None:
    # EnvironmentFiles override Environment=; a missing file the unit names with `-` is
    # skipped, as systemd skips it.
    h = Host()
    show = (
        ENV_EXEC_START
        + "Environment=VLLM_ARGS=--task\n"
        + "EnvironmentFiles=/etc/default/vllm (ignore_errors=no)\n"
        + "EnvironmentFiles=/etc/default/vllm-extra (ignore_errors=yes)\n"
    )
    missing = "cat: /etc/default/vllm-extra: No such file or directory"
    files = {
        "/etc/default/vllm": ok(("cat",), "HF_TOKEN=hf_x\nVLLM_ARGS='--max-model-len 65536'\n"),
        "/etc/default/vllm-extra": ok(("cat",), stderr=missing, status=1),
    }
    seen = _unit_with_env(h, show, files, [HELP_BEGIN, *HELP_LINES, HELP_END])
    assert run(h, version="0.16.0").status == "succeeded"
    assert seen == [("cat", "--", "/etc/default/vllm"), ("cat", "--", "/etc/default/vllm-extra")]
    said = ended(h, Step.PREFETCH).summary
    assert "every flag of the unit's ExecStart (2) is accepted by vllm 0.16.0" in said
    # The file's text (a token in it) is nowhere in what the run said.
    assert not any("hf_x" in str(n) for n in h.notices)


def test_an_optional_environment_file_this_login_cannot_read_is_not_skipped() -> None:
    # `EnvironmentFile=-/etc/default/vllm-extra`: systemd skips it only where it is
    # missing. One that is there but root's alone, systemd (as root) reads, and its
    # VLLM_ARGS would win over Environment='s: the flags are not known, never accepted.
    h = Host()
    show = (
        ENV_EXEC_START
        + 'Environment="VLLM_ARGS=--max-model-len 65536"\n'
        + "EnvironmentFiles=/etc/default/vllm-extra (ignore_errors=yes)\n"
    )
    denied = "cat: /etc/default/vllm-extra: Permission denied"
    files = {"/etc/default/vllm-extra": ok(("cat",), stderr=denied, status=1)}
    _unit_with_env(h, show, files, [HELP_BEGIN, *HELP_LINES, HELP_END])
    assert run(h, version="0.16.0").status == "succeeded"
    said = ended(h, Step.PREFETCH).summary
    assert f"/etc/default/vllm-extra could not be read (exit 1: {denied})" in said
    assert "the unit's flags were not checked: `$VLLM_ARGS`" in said
    assert "every flag of the unit's ExecStart" not in said


def test_an_environment_file_this_login_cannot_read_is_said_unchecked() -> None:
    h = Host()
    show = ENV_EXEC_START + "Environment=\nEnvironmentFiles=/etc/default/vllm (ignore_errors=no)\n"
    denied = ok(("cat",), stderr="cat: /etc/default/vllm: Permission denied", status=1)
    _unit_with_env(h, show, {"/etc/default/vllm": denied}, [HELP_BEGIN, *HELP_LINES, HELP_END])
    assert run(h, version="0.16.0").status == "succeeded"
    fetched = ended(h, Step.PREFETCH)
    assert fetched.ok
    assert (
        "the unit's flags were not checked: `$VLLM_ARGS`: /etc/default/vllm could not be "
        "read (exit 1: cat: /etc/default/vllm: Permission denied)"
    ) in fetched.summary
    assert "every flag of the unit's ExecStart" not in fetched.summary
    assert "WARNING: the unit's flags were not checked" in fetched.detail
