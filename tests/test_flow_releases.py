"""Side-by-side releases (issue 20, item 3) as a pure flow: the scripted host of
tests/test_sequence.py, with the releases' scripts answered from a model of the link and
the release directories. Each branch after the stop ends on a known release, with no
install after the stop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bot.core import remote_releases
from bot.core.flows import Emit, HttpCheck
from bot.core.phases.actions import ReadSwitchHistory, ReleaseSwitch, SwitchHistory
from bot.core.plan import Step
from bot.core.releases import Switch, SwitchKind
from bot.core.service_state import ServiceState
from bot.hosts.base import CommandResult, HttpResult
from tests.test_flow_gates import READY, end
from tests.test_sequence import TORCH_CUDA, Host, ok, run, steps

SBS: dict[str, Any] = {"strategy": "side_by_side"}
RELS = "/opt/venvs/vllm.releases"
OLD = "0.16.0rc2.dev313+g662205d34-000000000000"


@dataclass
class Releases(Host):
    """The link and the releases; which vllm each release holds (the live one serves)."""

    link: str | None = f"{RELS}/{OLD}"  # None: the venv is a plain directory
    held: dict[str, str] = field(default_factory=lambda: {OLD: "0.16.0rc2.dev313+g662205d34"})
    built_at: dict[str, float] = field(default_factory=lambda: {OLD: 1.0})
    switch_fails: Callable[[str], bool] = lambda name: False
    prune_ok: bool = True
    # The new release's smoke completion fails (it is not the one the host booted with).
    new_fails_smoke: bool = False
    switches: list[str] = field(default_factory=list)
    # The audit log's switches of this host's link (what a rollback by hand reads), and
    # the run whose switches the flow's notices add to it; ``unread``: it cannot say.
    history: list[Switch] = field(default_factory=list)
    run_id: int = 40
    unread: str | None = None

    def respond(self, action: Any) -> Any:
        if isinstance(action, ReadSwitchHistory):
            assert action.service == "kimi"
            if self.unread is not None:
                return SwitchHistory((), self.unread)
            return SwitchHistory(tuple(self.history))
        if isinstance(action, Emit) and isinstance(action.notice, ReleaseSwitch):
            n = action.notice
            self.history.append(Switch(n.before, n.after, self.run_id, n.kind))
        return super().respond(action)

    @property
    def live(self) -> str | None:
        return self.link.rsplit("/", 1)[1] if self.link else None

    def command(self, a: tuple[str, ...]) -> CommandResult:
        if a[:2] != ("/bin/sh", "-c"):
            if a[1:3] == ("pip", "show") and self.live is not None:
                self.version = self.held[self.live]
            return super().command(a)
        script, args = a[2], a[4:]
        if script == remote_releases.RELEASES_LIST:
            if self.link is None:
                return ok(a, stderr=f"{args[0]} is not a symbolic link", status=3)
            rows = "".join(f"release {t} {RELS}/{n}\n" for n, t in self.built_at.items())
            return ok(a, f"live {self.link}\n{rows}")
        if script == remote_releases.BUILD_RELEASE:
            name = args[-1]
            self.held[name] = self.installed_after
            self.built_at[name] = self.now
            gate = {"vllm": self.installed_after, "torch": "2.10.0", "cuda": TORCH_CUDA["2.10.0"]}
            line = "chatops-gate " + str(gate).replace("'", '"')
            return ok(a, f"{remote_releases.BUILT_MARK}\n{line}\n")
        if script == remote_releases.SWITCH_RELEASE:
            name = args[-1]
            self.switches.append(name)
            if self.switch_fails(name):
                return ok(a, stderr="mv: cannot move: Read-only file system", status=1)
            old, self.link = self.link, f"{RELS}/{name}"
            self.version = self.held[name]
            return ok(a, f"{remote_releases.SWITCHED_MARK} {old} -> {self.link}\n")
        if script == remote_releases.PRUNE_RELEASES:
            if not self.prune_ok:
                return ok(a, stderr="rm: cannot remove: Permission denied", status=1)
            for name in args[1:]:
                self.held.pop(name, None)
                self.built_at.pop(name, None)
            return ok(a, "".join(f"removed {n}\n" for n in args[1:]))
        return super().command(a)

    def http(self, action: HttpCheck) -> HttpResult:
        if action.url.endswith("/v1/completions") and self.new_fails_smoke and self.live != OLD:
            return HttpResult(action.url, 500, '{"error":{"message":"engine error"}}')
        return super().http(action)


def installs_after_stop(h: Host) -> list[tuple[str, ...]]:
    stop = next(i for i, a in enumerate(h.calls) if a[:2] == ("systemctl", "stop"))
    return [
        a
        for a in h.calls[stop:]
        if a[1:3] in (("pip", "install"), ("pip", "sync")) or remote_releases.BUILD_RELEASE in a
    ]


def test_a_side_by_side_redeploy_builds_before_the_stop_and_only_switches_after_it() -> None:
    h = Releases()
    out = run(h, svc=SBS, version="0.16.0")
    assert out.status == "succeeded", out.summary
    assert [s for s, _ in steps(h)] == [
        "preflight",
        "gpu_check",
        "build",
        "requests",
        "stop",
        "drain",
        "switch",
        "start",
        "health",
        "readiness",
        "postcheck",
        "prune",
        "gpu_recheck",
    ]
    assert all(good for _, good in steps(h))
    assert installs_after_stop(h) == []
    new = h.live
    assert new is not None and new.startswith("0.16.0-") and h.switches == [new]
    assert f"live release {new}" in end(h, Step.POSTCHECK).summary
    assert f"release {new} is live, {OLD} kept to roll back to" in out.summary


def test_a_build_cut_off_by_its_timeout_in_the_gate_is_a_timeout_not_a_gate() -> None:
    # The release was built (its mark printed), then `timeout` ended the script in the
    # import gate: nothing says the new build is bad, and nothing was stopped.
    h = Releases()
    inner = h.command

    def command(a: tuple[str, ...]) -> CommandResult:
        if a[:3] == ("/bin/sh", "-c", remote_releases.BUILD_RELEASE):
            out = f"{remote_releases.BUILT_MARK}\n"
            return CommandResult(a, 124, out, " + xgrammar==0.2.7\n", 60.0, timed_out=True)
        return inner(a)

    h.command = command  # type: ignore[method-assign]
    out = run(h, svc={**SBS, "install_timeout_s": 60}, version="0.16.0")
    assert out.status == "aborted", out.summary
    assert "timed out after 60s" in out.summary and "gate" not in out.summary, out.summary
    assert not any(a[:2] == ("systemctl", "stop") for a in h.calls)


def test_a_failed_readiness_switches_back_and_restarts_the_previous_release() -> None:
    h = Releases(new_fails_smoke=True)
    out = run(h, svc={**SBS, **READY}, version="0.16.0")
    assert out.status == "rolled_back", out.summary
    assert h.live == OLD and h.switches[-1] == OLD
    assert installs_after_stop(h) == []
    assert ("rollback_switch", True) in steps(h) and "rollback" not in [s for s, _ in steps(h)]
    assert "nothing reinstalled" in out.summary and out.state == ServiceState.UP


def test_a_failure_in_the_watch_window_switches_back() -> None:
    @dataclass
    class DiesLater(Releases):
        def http(self, action: HttpCheck) -> HttpResult:
            if action.url.endswith("/health") and self.live != OLD and self.now > 100:
                return HttpResult(action.url, 503)
            return super().http(action)

    h = DiesLater()
    out = run(h, svc={**SBS, "watch_s": 600, "watch_interval_s": 60}, version="0.16.0")
    assert out.status == "rolled_back", out.summary
    assert "watch window" in out.summary and h.live == OLD
    assert installs_after_stop(h) == []


def test_a_switch_that_fails_leaves_the_link_and_starts_the_previous_release() -> None:
    h = Releases(switch_fails=lambda name: name != OLD)
    out = run(h, svc=SBS, version="0.16.0")
    assert out.status == "rolled_back", out.summary
    assert "switching to release 0.16.0-" in out.summary and "Read-only file system" in out.summary
    assert h.live == OLD and [s for s, _ in steps(h)].count("rollback_start") == 1
    assert installs_after_stop(h) == []


def test_a_switch_whose_result_is_lost_stops_there_and_says_so() -> None:
    h = Releases(lose=lambda a: remote_releases.SWITCH_RELEASE in a)
    out = run(h, svc=SBS, version="0.16.0")
    assert out.status == "failed", out.summary
    assert out.state == ServiceState.STOPPED and "is unknown" in out.summary
    assert [a[1] for a in h.calls if a[:2] == ("systemctl", "start")] == []


def test_without_rollback_on_unhealthy_it_says_how_to_switch_back() -> None:
    h = Releases(new_fails_smoke=True)
    out = run(h, svc={**SBS, **READY, "rollback_on_unhealthy": False}, version="0.16.0")
    assert out.status == "failed", out.summary
    assert "Switch back with: `ln -s" in out.summary and f"{RELS}/{OLD}" in out.summary
    assert h.live != OLD


def test_a_failed_prune_does_not_fail_the_run() -> None:
    h = Releases(
        prune_ok=False,
        held={OLD: "x", "a-1": "0.15.0", "b-2": "0.15.1"},
        built_at={"a-1": 0.1, "b-2": 0.2, OLD: 1.0},
    )
    out = run(h, svc={**SBS, "keep_releases": 2}, version="0.16.0")
    assert out.status == "succeeded", out.summary
    assert ("prune", False) in steps(h) and "the prune failed" in out.summary


def test_the_prune_keeps_the_live_and_the_previous_release() -> None:
    h = Releases(
        held={OLD: "x", "a-1": "0.15.0", "b-2": "0.15.1"},
        built_at={"a-1": 0.1, "b-2": 0.2, OLD: 1.0},
    )
    out = run(h, svc={**SBS, "keep_releases": 2}, version="0.16.0")
    assert out.status == "succeeded", out.summary
    assert h.live is not None and set(h.held) == {OLD, h.live}


def test_a_venv_that_is_no_link_is_refused_before_the_stop() -> None:
    h = Releases(link=None)
    out = run(h, svc=SBS, version="0.16.0")
    assert out.status == "aborted", out.summary
    assert "not a side-by-side layout" in out.summary and "convert it first" in out.summary
    assert not any(a[:2] == ("systemctl", "stop") for a in h.calls)


def test_a_rollback_by_hand_switches_to_the_release_before_the_live_one() -> None:
    h = Releases(
        link=f"{RELS}/b-2",
        held={OLD: "0.16.0rc2.dev313+g662205d34", "b-2": "0.16.0"},
        built_at={OLD: 1.0, "b-2": 2.0},
    )
    out = run(h, "rollback", svc=SBS)
    assert out.status == "succeeded", out.summary
    assert h.live == OLD and h.switches == [OLD] and installs_after_stop(h) == []
    assert (out.version_before, out.version_after) == ("0.16.0", "0.16.0rc2.dev313+g662205d34")


def test_a_rollback_by_hand_without_a_previous_release_changes_nothing() -> None:
    h = Releases()
    out = run(h, "rollback", svc=SBS)
    assert out.status == "aborted" and "nothing to go back to" in out.summary
    assert not any(a[:2] == ("systemctl", "stop") for a in h.calls)


# ---- the switch history and a rollback by hand's target ----------------------------------

A, C = "0.15.1-aaaaaaaaaaaa", "0.16.0-cccccccccccc"


def after_a_failed_redeploy(**kw: Any) -> Releases:
    """The reported case: A was live until run 41 switched to OLD; run 42's release C
    failed its readiness, was switched back from and is kept for a look (built last)."""
    history = [
        Switch(A, OLD, 41, SwitchKind.SWITCH),
        Switch(OLD, C, 42, SwitchKind.SWITCH),
        Switch(C, OLD, 42, SwitchKind.SWITCH_BACK),
    ]
    return Releases(
        **{
            "held": {A: "0.15.1", OLD: "0.16.0rc2.dev313+g662205d34", C: "0.16.0"},
            "built_at": {A: 0.5, OLD: 1.0, C: 2.0},
            "history": history,
            **kw,
        }
    )


def test_every_switch_the_bot_makes_is_recorded_with_the_release_it_left() -> None:
    h = Releases()
    assert run(h, svc=SBS, version="0.16.0").status == "succeeded"
    new = h.live
    assert new is not None and h.history == [Switch(OLD, new, 40, SwitchKind.SWITCH)]
    # A failed readiness: the switch to the new release, then the switch back.
    h = Releases(new_fails_smoke=True)
    assert run(h, svc={**SBS, **READY}, version="0.16.0").status == "rolled_back"
    assert h.history == [
        Switch(OLD, h.switches[0], 40, SwitchKind.SWITCH),
        Switch(h.switches[0], OLD, 40, SwitchKind.SWITCH_BACK),
    ]
    # A switch that failed, or whose answer was lost, changed nothing anyone knows of.
    h = Releases(lose=lambda a: remote_releases.SWITCH_RELEASE in a)
    run(h, svc=SBS, version="0.16.0")
    assert h.history == []


def test_a_rollback_by_hand_after_a_failed_redeploy_goes_to_the_release_live_before() -> None:
    # The failed release C is the newest one not live: going there was going forward, and
    # the prune then removed A, the right target.
    h = after_a_failed_redeploy()
    out = run(h, "rollback", svc={**SBS, "keep_releases": 2})
    assert out.status == "succeeded", out.summary
    assert h.live == A and h.switches == [A]
    assert (
        f"live release {OLD}; switching to {A}: the release live before this one, switched "
        "away from by run #41"
    ) in end(h, Step.PREFLIGHT).summary
    # The prune keeps the target (live now) and the release it left; the failed one goes.
    assert set(h.held) == {A, OLD}
    assert h.history[-1] == Switch(OLD, A, 40, SwitchKind.SWITCH)
    # Asked again, it goes back to where the first one came from, and says so.
    h.run_id, h.notices = 43, []
    out = run(h, "rollback", svc={**SBS, "keep_releases": 2})
    assert out.status == "succeeded", out.summary
    assert h.live == OLD and "switched away from by run #40" in end(h, Step.PREFLIGHT).summary


def test_without_a_recorded_switch_it_goes_to_the_newest_release_built_before_the_live_one() -> (
    None
):
    # The history was lost (or predates the bot recording it): the build times decide,
    # and the failed release, built after the live one, is never the target.
    h = after_a_failed_redeploy(history=[])
    out = run(h, "rollback", svc=SBS)
    assert out.status == "succeeded", out.summary
    assert h.live == A
    assert (
        f"switching to {A}: no switch to the live release recorded: the newest release built "
        "before the live one"
    ) in end(h, Step.PREFLIGHT).summary
    # An audit log that cannot say is said, and the build times decide as well.
    h = after_a_failed_redeploy(unread="the audit log cannot say: database is locked")
    out = run(h, "rollback", svc=SBS)
    assert out.status == "succeeded" and h.live == A
    assert "the switch history cannot be read (the audit log cannot say: database is locked)" in (
        end(h, Step.PREFLIGHT).summary
    )


def test_a_rollback_by_hand_never_goes_to_a_newer_release_unless_the_history_says_so() -> None:
    # Only the failed release besides the live one: nothing to go back to, nothing stops.
    h = Releases(
        held={OLD: "0.16.0rc2.dev313+g662205d34", C: "0.16.0"},
        built_at={OLD: 1.0, C: 2.0},
        history=[Switch(OLD, C, 42, SwitchKind.SWITCH), Switch(C, OLD, 42, SwitchKind.SWITCH_BACK)],
    )
    out = run(h, "rollback", svc=SBS)
    assert out.status == "aborted", out.summary
    assert "nothing to go back to" in out.summary and "no switch to the live release" in out.summary
    assert not any(a[:2] == ("systemctl", "stop") for a in h.calls) and h.switches == []
    # The release live before, pruned since: the build times decide, and say why.
    h = after_a_failed_redeploy(history=[Switch("gone-1", OLD, 41, SwitchKind.SWITCH)])
    out = run(h, "rollback", svc=SBS)
    assert out.status == "succeeded" and h.live == A
    assert (
        "gone-1, live before this one until run #41, is no longer a complete release here: "
        "the newest release built before the live one"
    ) in end(h, Step.PREFLIGHT).summary
