"""Every sink of the engine's events takes every kind of event: each is fed one of each
member of ``bot.core.events.Event`` and must handle it as intended (act on it, or
ignore it on purpose) without raising.

mypy already fails a sink whose ``match`` forgets a member (``assert_never``); this
test holds the runtime side: the examples below cover the whole union, so a new event
cannot be added without being fed to every sink here too."""

from __future__ import annotations

import io
from typing import get_args

import pytest
from prometheus_client.exposition import generate_latest
from slack_sdk.web.async_client import AsyncWebClient

from bot.cli.terminal import TerminalSink
from bot.core import events as ev
from bot.core.gpu import Gpu, GpuSnapshot
from bot.core.health import GpuCheck
from bot.core.packages import EnvKind, PackageDiff
from bot.core.plan import Plan, PlannedStep, Step
from bot.core.redact import Redactor
from bot.core.releases import SwitchKind
from bot.core.service_state import ServiceState
from bot.core.status import Action, HostStatus, RunStatus, StepStatus
from bot.engine import gpu_health, preview
from bot.engine.exporter import Exporter
from bot.slack.blocks import CardView, initial_steps
from bot.slack.poster import Poster
from bot.slack.reporter import SlackReporter

PLAN = Plan(
    action=Action.REDEPLOY,
    service="svc",
    hosts=("gpu-1",),
    unit="vllm.service",
    package="vllm",
    version="0.16.0",
    spec="vllm==0.16.0",
    index_name=None,
    index_url=None,
    steps=(PlannedStep(Step.PREFLIGHT, "cmd preflight"),),
)
SNAPSHOT = GpuSnapshot("gpu-1", (Gpu(0, "GPU-0", "NVIDIA H200", 10, 143771, 0),))
DIFF = PackageDiff(changes=(), unchanged=3)
CHECK = GpuCheck(refusal=None)

# One of each event type, by type.
EXAMPLES: dict[type, ev.Event] = {
    type(e): e
    for e in (
        ev.RunStarted(1, PLAN, "U0ALICE", ("U0BOB",)),
        ev.StepStarted(1, "gpu-1", Step.PREFLIGHT, "cmd preflight"),
        ev.StepProgress(1, "gpu-1", Step.PREFLIGHT, "checking", elapsed_s=1.0),
        ev.OutputLine(1, "gpu-1", Step.PREFLIGHT, "stdout", "a line"),
        ev.StepFinished(1, "gpu-1", Step.PREFLIGHT, StepStatus.OK, 0, 0.5, "done", "a line"),
        ev.GpuTable(1, "gpu-1", "after drain", SNAPSHOT),
        ev.VersionsKnown(1, "gpu-1", "0.15.1", "0.16.0"),
        ev.PackagesKnown(1, "gpu-1", EnvKind.PLANNED, DIFF),
        ev.GpuHealthKnown(1, "gpu-1", CHECK),
        ev.HostFinished(1, "gpu-1", HostStatus.SUCCEEDED, "healthy", ServiceState.UP),
        ev.RunFinished(
            1, RunStatus.SUCCEEDED, "vllm 0.15.1 -> 0.16.0", "0.15.1", "0.16.0", ServiceState.UP
        ),
        ev.Notice(1, "the audit log cannot be written"),
        ev.RotationChanged(1, "gpu-1", "front", "node1", "out", True, "draining"),
        ev.ReleaseSwitched(1, "gpu-1", "svc", "0.15.1-a", "0.16.0-b", SwitchKind.SWITCH),
    )
}
EVENT_TYPES = sorted(get_args(ev.Event), key=lambda t: t.__name__)


def test_the_examples_cover_the_whole_event_union() -> None:
    assert set(EXAMPLES) == set(EVENT_TYPES)


def example(kind: type) -> ev.Event:
    return EXAMPLES[kind]


# ---- the terminal: every event prints, but those it leaves to others (a release switch
# is its step's line) -------------------------------------------------------------------

TERMINAL_SILENT = {ev.VersionsKnown, ev.GpuHealthKnown, ev.ReleaseSwitched}


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=lambda t: t.__name__)
async def test_the_terminal_sink_handles(kind: type) -> None:
    out = io.StringIO()
    await TerminalSink(out).handle(example(kind))
    assert (out.getvalue() == "") == (kind in TERMINAL_SILENT), out.getvalue()


# ---- Slack: every event changes the card or the thread, but output and the request's
# GPU verdict --------------------------------------------------------------------------


def reporter() -> SlackReporter:
    # apply() never touches Slack: the client is never called.
    poster = Poster(AsyncWebClient(token="xoxb-never-used"), Redactor(), post_interval_s=0)
    view = CardView(
        run_id=1,
        plan=PLAN,
        requested_by="U0ALICE",
        status=RunStatus.APPROVED,
        steps=initial_steps(PLAN),
    )
    return SlackReporter(poster, channel="C0OPS", ts="1.0", view=view)


# OutputLine is collected for the step's reply, GpuHealthKnown is the approval card's, a
# release switch is its step's line on the card.
SLACK_QUIET = {ev.OutputLine, ev.GpuHealthKnown, ev.ReleaseSwitched}


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=lambda t: t.__name__)
async def test_the_slack_reporter_handles(kind: type) -> None:
    r = reporter()
    before = r.view
    await r.handle(example(kind))
    assert r.pending == (kind not in SLACK_QUIET)
    if kind in SLACK_QUIET:
        assert r.view == before
    if kind is ev.OutputLine:
        # Kept for the step's reply: it shows when the step ends.
        r.apply(example(ev.StepFinished))
        assert "a line" in r._replies[-1].output


# ---- the request's reads: each keeps only its own event ------------------------------


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=lambda t: t.__name__)
async def test_the_preview_collector_handles(kind: type) -> None:
    collect = preview._Collect()
    await collect.handle(example(kind))
    assert collect.diff == (DIFF if kind is ev.PackagesKnown else None)


async def test_the_preview_collector_keeps_an_unknown_change_unknown() -> None:
    collect = preview._Collect()
    await collect.handle(ev.PackagesKnown(1, "gpu-1", EnvKind.PREVIEW, None, note="no uv"))
    assert collect.diff is None


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=lambda t: t.__name__)
async def test_the_gpu_health_collector_handles(kind: type) -> None:
    collect = gpu_health._Collect()
    await collect.handle(example(kind))
    assert collect.check == (CHECK if kind is ev.GpuHealthKnown else None)


# ---- the metrics: every event is taken; the counting ones count ---------------------


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=lambda t: t.__name__)
async def test_the_metrics_sink_handles(kind: type) -> None:
    exporter = Exporter(monotonic=lambda: 10.0)
    sink = exporter
    await sink.handle(example(ev.RunStarted))  # a run it knows
    await sink.handle(example(kind))
    text = generate_latest(exporter.registry).decode()
    counted = {
        ev.StepFinished: 'vllm_chatops_step_duration_seconds_count{action="redeploy",'
        'step="preflight"} 1.0',
        ev.RunFinished: 'vllm_chatops_runs_total{action="redeploy",service="svc",'
        'status="succeeded"} 1.0',
    }
    for k, line in counted.items():
        assert (line in text) == (k is kind), (kind, line)
