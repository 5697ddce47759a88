"""Issue 20, item 4: the watch window after the start, as a pure flow (scripted host,
the flow's clock): a clean window succeeds only after it; a failure inside it rolls back
with the check and the time; a cancel stops watching and leaves the new version up."""

from __future__ import annotations

from dataclasses import dataclass

from bot.core.flows import HttpCheck
from bot.core.plan import Step
from bot.core.service_state import ServiceState
from bot.hosts.base import HttpResult
from tests.test_flow_gates import READY, end
from tests.test_sequence import Host, run, steps, verbs

WATCH = {**READY, "watch_s": 600, "watch_interval_s": 60}


@dataclass
class HangsAt(Host):
    """/health stays 200, the smoke completion fails from ``hang_from`` on (flow clock)."""

    hang_from: float = 10**9

    def http(self, action: HttpCheck) -> HttpResult:
        if action.url.endswith("/v1/completions") and self.now >= self.hang_from:
            return HttpResult(action.url, None, "", "timed out after 60s")
        return super().http(action)


def test_watch_off_keeps_todays_steps() -> None:
    h = Host()
    out = run(h, svc=READY)
    assert out.status == "succeeded", out.summary
    assert "watch" not in [s for s, _ in steps(h)]


def test_a_clean_window_succeeds_only_after_it() -> None:
    h = HangsAt()
    out = run(h, svc=WATCH)
    assert out.status == "succeeded", out.summary
    assert "watched 600s clean" in out.summary
    watch = end(h, Step.WATCH)
    assert watch.ok and watch.summary.startswith("10 round(s) of checks over 10m")
    names = [s for s, _ in steps(h)]
    assert names.index("watch") < names.index("postcheck")
    assert h.now >= 600
    # Each clean round but the last is said in place on the card while the window runs.
    shown = [p.text for p in h.progress if p.step == Step.WATCH]
    assert shown[0] == "1 round(s) clean, at 1m00s of 10m00s" and len(shown) == 9, shown


def test_a_hang_inside_the_window_rolls_back_with_the_check_and_the_time() -> None:
    # Readiness passes (its completion is before the window), then the window's fail.
    h = _hang_after_readiness()
    out = run(h, svc=WATCH)
    assert out.status == "rolled_back", out.summary
    assert "watch window: POST http://127.0.0.1:8000/v1/completions" in out.summary
    assert "of 10m00s)" in out.summary
    assert not end(h, Step.WATCH).ok
    assert verbs(h)[-2:] == ["rollback", "start"]
    assert out.state == ServiceState.UP


def _hang_after_readiness() -> HangsAt:
    class AfterReady(HangsAt):
        def http(self, action: HttpCheck) -> HttpResult:
            if (
                action.url.endswith("/v1/completions")
                and any(getattr(n, "step", None) == Step.WATCH for n in self.notices)
                and not any(getattr(n, "step", None) == Step.ROLLBACK for n in self.notices)
            ):
                return HttpResult(action.url, None, "", "timed out after 60s")
            return Host.http(self, action)

    return AfterReady()


def test_a_cancel_in_the_window_stops_watching_and_leaves_the_new_version_up() -> None:
    h = Host(cancel_at=lambda a: getattr(a, "seconds", None) == 60 and h.now >= 120)
    out = run(h, svc=WATCH)
    assert out.status == "cancelled", out.summary
    assert "the new version is left running" in out.summary
    assert out.state == ServiceState.UP
    assert "rollback" not in verbs(h)
    assert end(h, Step.WATCH).ok
