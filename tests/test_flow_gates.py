"""The flows' new gates, driven by hand-made outcomes (no I/O): in-flight requests
drained before the stop, start-up progress from the journal, and model-level
readiness after /health. The host model is tests/test_sequence.py's ``Host``."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from bot.core.flows import FOLLOW_FAILED_READS, UNKNOWN_LOAD_READS, EndStep, HttpCheck, Progress
from bot.core.plan import Step
from bot.core.service_state import ServiceState
from bot.hosts.base import CommandResult, HttpResult
from tests.test_metrics_readiness import vllm_metrics
from tests.test_real_vllm_samples import PERMISSION, usage_thread_traceback
from tests.test_sequence import Host, run, steps, verbs
from tests.test_startup import ENGINE, FAILURES, START_UP

READY = {
    "served_model": "kimi-k2.5",
    "smoke_prompt": "The capital of France is",
    "smoke_expect": "Paris",
}


def end(h: Host, step: Step) -> EndStep:
    return next(n for n in h.notices if isinstance(n, EndStep) and n.step == step)


def follow(*lines: str, cursor: str = "s=1;i=1") -> str:
    """What one ``journalctl --show-cursor -o cat`` poll prints."""
    return "".join(f"{ln}\n" for ln in lines) + f"-- cursor: {cursor}\n"


# ---- readiness ------------------------------------------------------------------------------


def test_a_ready_server_passes_each_check_and_says_so() -> None:
    h = Host(version_answer=(200, '{"version":"0.16.0"}'))
    out = run(h, svc=READY, version="0.16.0")
    assert out.status == "succeeded", out.summary
    ready = end(h, Step.READINESS)
    assert ready.ok
    assert ready.detail.splitlines() == [
        "ok: GET http://127.0.0.1:8000/v1/models lists kimi-k2.5",
        "ok: POST http://127.0.0.1:8000/v1/completions answered ' Paris.', matches 'Paris'",
        "ok: GET http://127.0.0.1:8000/version reports 0.16.0, the installed version",
    ]
    smoke = next(r for r in h.requests if r.url.endswith("/v1/completions"))
    assert smoke.method == "POST" and smoke.content_type == "application/json"
    assert smoke.body is not None and b'"temperature": 0' in smoke.body
    assert b'"model": "kimi-k2.5"' in smoke.body


def test_the_wrong_model_is_a_failed_start_with_the_journal() -> None:
    h = Host(models=(200, '{"object":"list","data":[{"id":"Kimi-K2-Instruct"}]}'))
    out = run(h, svc=READY)
    assert out.status == "failed"
    assert "lists Kimi-K2-Instruct, not kimi-k2.5" in out.summary
    ready = end(h, Step.READINESS)
    assert not ready.ok and "journalctl -u vllm-kimi-k25 -n 50" in ready.detail
    assert not any(r.url.endswith("/v1/completions") for r in h.requests)
    assert ("postcheck", True) not in steps(h)


def test_smoke_failures_fail_the_start() -> None:
    cases: list[tuple[tuple[int, str], str]] = [
        (
            (500, '{"object":"error","message":"EngineCore died","code":500}'),
            "HTTP 500: EngineCore died",
        ),
        ((200, '{"choices":[{"index":0,"text":""}]}'), "does not match 'Paris'"),
        ((200, '{"choices":[{"index":0,"text":" Lyon."}]}'), "' Lyon.' does not match 'Paris'"),
        ((200, '{"detail":"Not Found"}'), "without a completion"),
    ]
    for completion, says in cases:
        h = Host(completion=completion)
        out = run(h, svc=READY)
        assert out.status == "failed", completion
        assert says in out.summary, (says, out.summary)


def test_without_an_expectation_any_non_empty_text_passes_but_empty_fails() -> None:
    svc = {"smoke_prompt": "Hello"}
    h = Host(models=(200, '{"object":"list","data":[{"id":"a"},{"id":"b"}]}'))
    assert run(h, svc=svc).status == "succeeded"
    # Without served_model, the smoke test asks the first model listed.
    smoke = next(r for r in h.requests if r.url.endswith("/v1/completions"))
    assert smoke.body is not None and b'"model": "a"' in smoke.body
    h = Host(completion=(200, '{"choices":[{"index":0,"text":"  "}]}'))
    out = run(h, svc=svc)
    assert out.status == "failed" and "empty completion" in out.summary


def test_a_version_the_server_reports_must_be_the_installed_one() -> None:
    h = Host(version_answer=(200, '{"version":"0.15.1"}'))
    out = run(h, version="0.16.0")
    assert out.status == "failed"
    assert "the server reports version 0.15.1, but vllm 0.16.0 is installed" in out.summary
    h = Host()  # /version answers 404: nothing to compare
    assert run(h).status == "succeeded"
    assert end(h, Step.READINESS).detail.startswith(
        "skipped: GET http://127.0.0.1:8000/version reports no version (HTTP 404: "
    )


def test_a_rollback_start_is_gated_on_readiness_too() -> None:
    h = Host(install_fails=1, models=(200, '{"object":"list","data":[]}'))
    out = run(h, svc=READY)
    assert out.status == "failed"
    assert ("rollback_readiness", False) in steps(h)


def test_a_running_unit_that_is_not_ready_is_never_called_down() -> None:
    # The rollback serves the wrong model too: the unit is up, so "DOWN" would be false.
    wrong = (200, '{"object":"list","data":[{"id":"Kimi-K2-Instruct"}]}')
    h = Host(models=wrong)
    out = run(h, svc=READY)
    assert out.status == "failed"
    assert ("rollback_readiness", False) in steps(h)
    assert out.state == ServiceState.UP_NOT_READY
    assert out.summary.endswith("The service is UP but NOT READY (unit active)."), out.summary
    # A restart the same, and the state is read after the gate, not assumed.
    h = Host(models=wrong)
    out = run(h, "restart", svc=READY)
    assert out.state == ServiceState.UP_NOT_READY
    assert h.calls[-1] == ("systemctl", "is-active", "--no-pager", "--", "vllm-kimi-k25")
    h = Host(unit_dies=True)
    out = run(h, "restart")
    assert out.state == ServiceState.DOWN and "is failed after start" in out.summary


class Restarting(Host):
    """A unit with Restart=on-failure between two tries: `is-active` says activating."""

    def command(self, a: tuple[str, ...]) -> CommandResult:
        if a[:2] == ("systemctl", "is-active") and self.stopped:
            return CommandResult(a, 3, "activating\n", "", 0.0)
        return super().command(a)


def test_a_unit_systemd_is_restarting_is_down_not_up() -> None:
    out = run(Restarting(), "restart", svc={"start_timeout_s": 5})
    assert out.status == "failed" and out.state == ServiceState.DOWN
    assert out.summary.endswith(
        "The service is DOWN (unit activating: systemd is starting it again or still starting it)."
    ), out.summary


# ---- in-flight requests ------------------------------------------------------------------------


def busy(running: int, waiting: int = 0) -> str:
    return vllm_metrics({"0": running}, {"0": waiting}, {"0": 0.3})


def test_the_stop_waits_until_no_request_runs_or_waits() -> None:
    h = Host(metrics=[busy(3, 1), busy(2), busy(1), busy(0)])
    out = run(h)
    assert out.status == "succeeded"
    shown = [p.text for p in h.progress if p.step == Step.REQUESTS]
    assert shown == [
        "3 running, 1 waiting requests, KV cache 30 % used",
        "2 running, 0 waiting requests, KV cache 30 % used",
        "1 running, 0 waiting requests, KV cache 30 % used",
        "0 running, 0 waiting requests, KV cache 30 % used",
    ]
    assert end(h, Step.REQUESTS).summary.startswith("in-flight requests finished after 3.0s")
    # Every /metrics read came before the stop.
    assert verbs(h) == ["stop", "install", "start"]


def test_requests_still_running_at_the_deadline_abort_with_the_service_untouched() -> None:
    h = Host(metrics=[busy(2)])
    out = run(h, svc={"request_drain_timeout_s": 5})
    assert out.status == "aborted"
    assert out.summary.startswith(
        "2 running, 0 waiting requests, KV cache 30 % used still in "
        "flight after 5s; service untouched"
    )
    assert out.state == ServiceState.UP  # as preflight read it
    assert "--force" in out.summary
    assert verbs(h) == []


def test_force_stops_at_once_and_says_what_it_interrupts() -> None:
    h = Host(metrics=[busy(2, 1)])
    out = run(h, force=True)
    assert out.status == "succeeded"
    assert end(h, Step.REQUESTS).summary == (
        "--force: stopping with 2 running, 1 waiting requests, KV cache 30 % used, which are "
        "interrupted"
    )
    assert len([r for r in h.requests if r.url.endswith("/metrics")]) == 1


def test_zero_disables_the_wait() -> None:
    h = Host(metrics=[busy(4)])
    assert run(h, "restart", svc={"request_drain_timeout_s": 0}).status == "succeeded"
    assert end(h, Step.REQUESTS).summary.startswith("not waiting (request_drain_timeout_s = 0)")


# /metrics of a server started with --disable-log-stats: prometheus_client's default
# families and no vllm: one (the shape vllm-project/vllm issue #26762 and PR #3938 show).
NO_VLLM_GAUGES = (
    "# HELP python_gc_objects_collected_total Objects collected during gc\n"
    "# TYPE python_gc_objects_collected_total counter\n"
    'python_gc_objects_collected_total{generation="0"} 8841.0\n'
    "# HELP python_info Python platform information\n"
    "# TYPE python_info gauge\n"
    'python_info{implementation="CPython",major="3",minor="12",patchlevel="3",'
    'version="3.12.3"} 1.0\n'
    "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
    "# TYPE process_resident_memory_bytes gauge\n"
    "process_resident_memory_bytes 3.1e+09\n"
)
UNKNOWN = (
    "the load is unknown: http://127.0.0.1:8000/metrics has no "
    "vllm:num_requests_running or vllm:num_requests_waiting, and vllm-kimi-k25 is "
    "active; pass --force to stop anyway"
)


@dataclass
class MetricsHost(Host):
    """/metrics answers (status, body) in turn, the last repeating (status None: no
    answer); ``systemctl is-active`` says ``before_stop`` until the unit is stopped."""

    answers: list[tuple[int | None, str]] = field(default_factory=list)
    before_stop: str = "active"

    def http(self, action: HttpCheck) -> HttpResult:
        if urlsplit(action.url).path != "/metrics" or not self.answers:
            return super().http(action)
        self.requests.append(action)
        status, body = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if status is None:
            return HttpResult(action.url, None, error="connection refused")
        return HttpResult(action.url, status, body)

    def command(self, a: tuple[str, ...]) -> CommandResult:
        if a[:2] == ("systemctl", "is-active") and not self.stopped:
            state = self.before_stop
            return CommandResult(a, 0 if state == "active" else 3, f"{state}\n", "", 0.0)
        return super().command(a)


def metrics_reads(h: Host) -> int:
    return len([r for r in h.requests if r.url.endswith("/metrics")])


def test_a_load_that_cannot_be_read_refuses_the_stop_with_the_reason() -> None:
    # An empty body (vllm-project/vllm issue #8612) and --disable-log-stats' families: 200,
    # and nothing about the requests. Unknown is not idle: nothing is stopped.
    for body in ("", NO_VLLM_GAUGES):
        for action in ("redeploy", "restart"):
            h = Host(metrics=[body])
            out = run(h, action)
            assert out.status == "aborted", (body, action)
            assert out.summary == f"{UNKNOWN}. Service untouched.", out.summary
            assert out.state == ServiceState.UP
            assert verbs(h) == [] and ("requests", False) in steps(h)
            assert end(h, Step.REQUESTS).summary == UNKNOWN
            assert metrics_reads(h) == 1  # an answer that says nothing says it again
    # Text that is not Prometheus format, and a server with one gauge of the two.
    h = Host(metrics=["<html>not found</html> {{"])
    assert run(h).status == "aborted" and verbs(h) == []
    assert end(h, Step.REQUESTS).summary.startswith(
        "the load is unknown: http://127.0.0.1:8000/metrics: not Prometheus text"
    )
    one = "\n".join(ln for ln in busy(0).splitlines() if "num_requests_waiting" not in ln)
    h = Host(metrics=[one + "\n"])
    assert run(h).status == "aborted" and verbs(h) == []
    assert "has no vllm:num_requests_waiting, and" in end(h, Step.REQUESTS).summary


def test_force_or_a_zero_drain_timeout_stops_with_the_load_unknown() -> None:
    h = Host(metrics=[NO_VLLM_GAUGES])
    out = run(h, force=True)
    assert out.status == "succeeded", out.summary
    assert end(h, Step.REQUESTS).summary.startswith(
        "--force: stopping with the load unknown (http://127.0.0.1:8000/metrics has no "
        "vllm:num_requests_running"
    )
    assert verbs(h) == ["stop", "install", "start"]
    # request_drain_timeout_s = 0 keeps its meaning: the stop does not wait for requests,
    # known or not. No reading again, no unit check.
    h = MetricsHost(answers=[(None, "")])
    assert run(h, "restart", svc={"request_drain_timeout_s": 0}).status == "succeeded"
    assert end(h, Step.REQUESTS).summary.startswith(
        "not waiting (request_drain_timeout_s = 0): the load is unknown"
    )
    assert metrics_reads(h) == 1
    stop = h.calls.index(("systemctl", "stop", "--no-pager", "--", "vllm-kimi-k25"))
    assert not any(a[:2] == ("systemctl", "is-active") for a in h.calls[:stop])


def test_a_unit_that_does_not_run_has_no_request_to_cut() -> None:
    # Down already (a failed earlier run): /metrics refuses, systemd says why. The stop
    # may go on: there is no process, so no request to interrupt.
    for state in ("inactive", "failed"):
        h = MetricsHost(answers=[(None, "")], before_stop=state)
        out = run(h, "restart")
        assert out.status == "succeeded", (state, out.summary)
        assert end(h, Step.REQUESTS).summary == (
            "the load is unknown (http://127.0.0.1:8000/metrics did not answer with metrics "
            f"(connection refused)), but vllm-kimi-k25 is {state}: no request to interrupt"
        )
    # A unit systemd is starting or stopping, or whose state cannot be read, may serve:
    # refused like an active one.
    for state in ("activating", "deactivating"):
        h = MetricsHost(answers=[(None, "")], before_stop=state)
        out = run(h)
        assert out.status == "aborted" and verbs(h) == [], state
        assert f"and vllm-kimi-k25 is {state}; pass --force" in out.summary


def test_a_metrics_read_that_got_no_answer_is_tried_again() -> None:
    # One lost read is no verdict: the next one counts.
    h = MetricsHost(answers=[(None, ""), (200, busy(0))])
    out = run(h)
    assert out.status == "succeeded", out.summary
    assert end(h, Step.REQUESTS).summary == "no request in flight"
    assert metrics_reads(h) == 2
    assert next(p.text for p in h.progress if p.step == Step.REQUESTS).startswith(
        "load unknown (http://127.0.0.1:8000/metrics did not answer with metrics"
    )
    # A 503 is tried again too; a 404 is final.
    h = MetricsHost(answers=[(503, ""), (200, busy(0))])
    assert run(h).status == "succeeded" and metrics_reads(h) == 2
    h = MetricsHost(answers=[(404, '{"detail":"Not Found"}')])
    assert run(h).status == "aborted" and metrics_reads(h) == 1
    # No answer UNKNOWN_LOAD_READS times with the unit active: refused.
    h = MetricsHost(answers=[(None, "")])
    out = run(h)
    assert out.status == "aborted" and verbs(h) == []
    assert metrics_reads(h) == UNKNOWN_LOAD_READS
    assert (
        "did not answer with metrics (connection refused), and vllm-kimi-k25 is active"
        in out.summary
    )


def test_a_server_that_stops_answering_mid_drain_is_not_taken_for_idle() -> None:
    # Busy, then /metrics has no gauges any more: the requests may still run.
    h = Host(metrics=[busy(2), busy(1), NO_VLLM_GAUGES])
    out = run(h)
    assert out.status == "aborted" and verbs(h) == []
    detail = end(h, Step.REQUESTS).detail.splitlines()
    assert detail[0].endswith("2 running, 0 waiting requests, KV cache 30 % used")
    assert detail[-1] == UNKNOWN


def test_a_cancel_while_requests_drain_changes_nothing() -> None:
    h = Host(metrics=[busy(2)], cancel_at=lambda a: isinstance(a, Progress))
    out = run(h)
    assert out.status == "cancelled" and "nothing was changed" in out.summary
    assert verbs(h) == []


# ---- start-up progress ---------------------------------------------------------------------------


def test_the_phase_is_followed_from_the_journal_during_the_health_wait() -> None:
    lines = [ln for ln, _, _, _ in START_UP]
    h = Host(
        healthy_after_checks=6,
        journal=[
            follow("the last line of the previous run"),
            follow(*lines[:4]),
            follow(*lines[4:6]),
            follow(*lines[6:11]),
            follow(*lines[11:14]),
            follow(*lines[14:]),
        ],
    )
    assert run(h).status == "succeeded"
    shown = [p.text for p in h.progress if p.step == Step.HEALTH]
    assert shown[:5] == [
        "loading weights",
        "loading weights 59 % (38/64)",
        "sizing the KV cache",
        "engine initialised",
        "API server up",
    ]
    assert all(p.start_up and p.elapsed_s is not None for p in h.progress if p.step == Step.HEALTH)
    # Each poll after the first asks for what follows the cursor the last one printed.
    follows = [a for a in h.calls if a[0] == "journalctl" and "--show-cursor" in a]
    assert any("--after-cursor=s=1;i=1" in a for a in follows)
    assert "last phase: API server up" in end(h, Step.HEALTH).summary


def test_progress_without_a_new_phase_is_shown_only_every_progress_interval() -> None:
    h = Host(healthy_after_checks=60)  # 2 s polls: about two minutes of nothing new
    assert run(h, svc={"start_timeout_s": 600, "progress_interval_s": 30}).status == "succeeded"
    times = [p.elapsed_s for p in h.progress if p.step == Step.HEALTH]
    assert len(times) <= 1 + 120 // 30 + 1, times
    assert all(
        p.text == "waiting for the first log line" for p in h.progress if p.step == Step.HEALTH
    )


def test_an_oom_traceback_ends_the_wait_at_once_with_its_lines() -> None:
    tb = [
        ENGINE + "ERROR 11-30 13:04:02 [core.py:708] EngineCore failed to start.",
        ENGINE + "Traceback (most recent call last):",
    ]
    h = Host(
        healthy_after_checks=10**6,
        journal=[follow(), follow(START_UP[5][0]), follow(*tb), follow(FAILURES[0][0])],
    )
    out = run(h, svc={"start_timeout_s": 1800, "rollback_on_unhealthy": False})
    assert out.status == "failed"
    assert out.summary.startswith(
        "start-up failed: CUDA out of memory: (EngineCore_DP0 "
        "pid=48253) torch.OutOfMemoryError: CUDA out of memory."
    )
    health = end(h, Step.HEALTH)
    assert "EngineCore failed to start." in health.detail
    assert health.detail.endswith(FAILURES[0][0])  # the lines that said so, last
    assert "journalctl -u vllm-kimi-k25 -n 50 --no-pager" in health.detail
    assert h.now < 30  # seconds of the flow's clock, not start_timeout_s
    # systemd still shows the unit active (its process has not exited yet), but a start
    # that failed in the journal serves nothing: DOWN, never "UP but NOT READY".
    assert out.state == ServiceState.DOWN
    assert (
        "The service is DOWN: its start failed (the unit is still active until its "
        "process exits; it may hold the GPUs until then). Roll back with: "
    ) in out.summary


def test_a_threads_traceback_during_the_start_is_a_warning_and_health_decides() -> None:
    # Issue 17, D4: vLLM's usage-stats thread dies (vllm-project/vllm issue #6340's shape);
    # the server goes on and answers /health. The start succeeds, and says what happened.
    thread = usage_thread_traceback(ENGINE)
    h = Host(
        healthy_after_checks=4,
        journal=[follow(), follow(START_UP[5][0]), follow(*thread[:6]), follow(*thread[6:])],
    )
    out = run(h, svc={"start_timeout_s": 1800})
    assert out.status == "succeeded", out.summary
    health = end(h, Step.HEALTH)
    assert health.ok and health.summary.endswith(
        "(last phase: loading weights 59 % (38/64); warning: thread Thread-3 "
        f"(_report_usage_worker) died: {PERMISSION})"
    )
    assert health.detail.splitlines()[0] == thread[0] and health.detail.endswith(thread[-1])
    shown = [p.text for p in h.progress if p.step == Step.HEALTH]
    assert any("warning: thread Thread-3 (_report_usage_worker) died" in t for t in shown)
    # The other way: the same lines with no thread header are the main process failing.
    h = Host(
        healthy_after_checks=10**6,
        journal=[follow(), follow(START_UP[5][0]), follow(*thread[1:6]), follow(*thread[6:])],
    )
    out = run(h, svc={"start_timeout_s": 1800, "rollback_on_unhealthy": False})
    assert out.status == "failed"
    assert out.summary.startswith(f"start-up failed: Python traceback: {ENGINE}{PERMISSION}")
    assert h.now < 30  # at once, not at start_timeout_s


def test_the_journal_is_read_once_more_when_health_answers() -> None:
    # The lines logged between the last poll and /health's 200 are this start's too: the
    # thread's death is reported, the last phase is the one reached.
    thread = usage_thread_traceback(ENGINE)
    h = Host(
        healthy_after_checks=2,
        journal=[follow(), follow(START_UP[5][0]), follow(), follow(*thread, START_UP[-1][0])],
    )
    assert run(h).status == "succeeded"
    assert end(h, Step.HEALTH).summary.endswith(
        f"(last phase: API server up; warning: thread Thread-3 (_report_usage_worker) died: "
        f"{PERMISSION})"
    )
    # A failure line found by that read is a failed start, though /health answered once.
    h = Host(
        healthy_after_checks=2,
        journal=[
            follow(),
            follow(START_UP[5][0]),
            follow(),
            follow(FAILURES[4][0], FAILURES[0][0]),
        ],
    )
    out = run(h, svc={"rollback_on_unhealthy": False})
    assert out.status == "failed"
    assert out.summary.startswith("start-up failed: CUDA out of memory"), out.summary


def test_a_follower_behind_reads_on_until_it_reaches_the_failure() -> None:
    # journalctl gives the first journal_follow_lines (1000) entries after the cursor: a
    # start that logged 1000 lines of noise and then its OOM since the last poll is read
    # on in the same poll, before the unit's death could end the wait without its cause.
    noise = [
        f"(Worker_TP1 pid=48300) INFO [custom_all_reduce.py:203] Registering {i} cuda "
        "graph addresses"
        for i in range(1000)
    ]
    tb = [
        ENGINE + "ERROR 11-30 13:04:02 [core.py:708] EngineCore failed to start.",
        ENGINE + "Traceback (most recent call last):",
        FAILURES[0][0],
    ]
    h = Host(
        unit_dies=True,
        journal=[follow(), follow(*noise, cursor="s=1;i=3e8"), follow(*tb, cursor="s=1;i=3eb")],
    )
    out = run(h, svc={"rollback_on_unhealthy": False})
    assert out.summary.startswith("start-up failed: CUDA out of memory: "), out.summary
    reads = [a for a in h.calls if a[0] == "journalctl" and "--show-cursor" in a]
    assert "--after-cursor=s=1;i=3e8" in reads[2]  # read on from where the first stopped


class JournalRefused(Host):
    """A become = "sudo" host: no sudo rule allows `journalctl --after-cursor` (see
    bot.core.sudoers), so sudo refuses every follow read after the cursor; or, with
    ``stderr``, journalctl itself fails."""

    stderr = ""

    def command(self, a: tuple[str, ...]) -> CommandResult:
        if a[0] == "journalctl" and any(x.startswith("--after-cursor=") for x in a):
            if self.stderr:
                return CommandResult(a, 1, "", self.stderr, 0.0)
            return CommandResult(
                a,
                1,
                "",
                "sudo: a password is required\n",
                0.0,
                refused=(
                    f"sudo refused `{' '.join(a)}` as root: a password is required. The host's "
                    "sudoers drop-in lacks the rule ..."
                ),
            )
        return super().command(a)


def test_a_journal_that_cannot_be_read_is_said_once_and_not_read_again() -> None:
    h = JournalRefused(healthy_after_checks=8, journal=[follow("old", cursor="s=9;i=41")])
    out = run(h, svc={"progress_interval_s": 1000})
    assert out.status == "succeeded"  # the health gate decides as ever
    follows = [a for a in h.calls if a[0] == "journalctl" and "--show-cursor" in a]
    # The cursor before the start, then one refused read: none more in 8 polls.
    assert len(follows) == 2, follows
    shown = [p.text for p in h.progress if p.step == Step.HEALTH]
    assert shown == ["journal not readable (sudo refused it); phase unknown"], shown
    assert end(h, Step.HEALTH).summary.endswith(
        "(last phase: journal not readable (sudo refused it); phase unknown)"
    )
    # journalctl's own failure: given up after FOLLOW_FAILED_READS in a row, said with
    # its first words (a failing read may be a passing hitch: see the next test).
    h = JournalRefused(healthy_after_checks=8, journal=[follow("old", cursor="s=9;i=41")])
    h.stderr = "Failed to seek to cursor: Invalid argument\n"
    assert run(h, svc={"progress_interval_s": 1000}).status == "succeeded"
    follows = [a for a in h.calls if a[0] == "journalctl" and "--show-cursor" in a]
    assert len(follows) == 1 + FOLLOW_FAILED_READS, follows
    assert [p.text for p in h.progress if p.step == Step.HEALTH][-1] == (
        "journal not readable (exit 1: Failed to seek to cursor: Invalid argument); phase unknown"
    )


class JournalHitch(Host):
    """The first follow read times out (a slow journal during a heavy weight load); the
    next ones answer."""

    hitches = 1

    def command(self, a: tuple[str, ...]) -> CommandResult:
        if (
            a[0] == "journalctl"
            and any(x.startswith("--after-cursor=") for x in a)
            and self.hitches > 0
        ):
            self.hitches -= 1
            return CommandResult(a, 124, "", "timed out after 30s\n", 30.0, timed_out=True)
        return super().command(a)


def test_one_failed_journal_read_does_not_switch_off_the_failure_detection() -> None:
    h = JournalHitch(
        journal=[follow("old", cursor="s=9;i=41"), follow(FAILURES[0][0], cursor="s=9;i=60")],
        healthy_after_checks=10**6,
    )
    out = run(h, svc={"start_timeout_s": 1800, "rollback_on_unhealthy": False})
    assert out.status == "failed"
    assert out.summary.startswith("start-up failed: CUDA out of memory"), out.summary


def test_the_shm_broadcast_warning_does_not_end_the_wait() -> None:
    shm = (
        ENGINE + "INFO 11-30 13:10:31 [shm_broadcast.py:501] No available shared memory "
        "broadcast block found in 60 seconds. This typically happens when some processes "
        "are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
        "quantization)."
    )
    h = Host(healthy_after_checks=4, journal=[follow(shm), follow(shm)])
    assert run(h).status == "succeeded"


def test_following_starts_after_the_cursor_read_before_the_start() -> None:
    h = Host()
    h.journal = [follow("an old line", cursor="s=9;i=41")]  # answers the pre-start read
    run(h)
    reads = [a for a in h.calls if a[0] == "journalctl" and "--show-cursor" in a]
    assert "-n" in reads[0] and reads[0][reads[0].index("-n") + 1] == "1"
    assert "--after-cursor=s=9;i=41" in reads[1]


# ---- status ---------------------------------------------------------------------------------


def test_status_shows_the_served_model_and_the_load() -> None:
    h = Host(metrics=[busy(3, 2)])
    out = run(h, "status")
    assert out.status == "succeeded"
    assert "serving kimi-k2.5; 3 running, 2 waiting requests, KV cache 30 % used" in out.summary
