"""Block Kit builders stay within Slack's limits whatever they are given."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.health import HealthNote, Level
from bot.core.plan import Plan, PlannedStep, Step
from bot.core.status import Action, RunStatus, StepStatus
from bot.slack.blocks import (
    MAX_MESSAGE_TEXT,
    MAX_SECTION_TEXT,
    CardView,
    LeftoverAsk,
    Message,
    StepLine,
    code_answer,
    code_head,
    code_pages_answer,
    code_tail,
    escape,
    gpu_health_blocks,
    initial_steps,
    leftovers_reply,
    message,
    notice_reply,
    outcome_reply,
    run_card,
    section,
    step_reply,
    tail_answer,
)
from tests.fakes import validate_blocks

STATUSES = list(RunStatus)  # every status a card can show, a new one included


def plan(*, hosts: int = 1, command: str = "systemctl stop vllm", name: str = "svc") -> Plan:
    steps = tuple(
        PlannedStep(s, command)
        for s in (
            Step.PREFLIGHT,
            Step.STOP,
            Step.DRAIN,
            Step.REINSTALL,
            Step.START,
            Step.HEALTH,
            Step.POSTCHECK,
        )
    )
    return Plan(
        action=Action.REDEPLOY,
        service=name,
        hosts=tuple(f"gpu-{i}" for i in range(hosts)),
        unit="vllm.service",
        package="vllm",
        version="0.16.0",
        spec="vllm==0.16.0",
        index_name="nightly",
        index_url="https://wheels.example/nightly",
        steps=steps,
    )


def assert_within_limits(msg: Message) -> None:
    assert validate_blocks(msg.blocks) == []
    assert 0 < len(msg.text) <= MAX_MESSAGE_TEXT
    for block in msg.blocks:
        if block["type"] == "section" and "text" in block:
            assert len(block["text"]["text"]) <= MAX_SECTION_TEXT


def huge_view(status: RunStatus) -> CardView:
    p = plan(hosts=40, command="x" * 20_000)
    steps = tuple(
        StepLine(
            line.host,
            line.step,
            state=StepStatus.FAILED,
            duration_s=12345.6,
            summary="<!channel> " + "y" * 10_000,
        )
        for line in initial_steps(p)
    )
    return CardView(
        run_id=7,
        plan=p,
        requested_by="U0ALICE",
        status=status,
        needed=3,
        approvals=tuple(f"U{i:08d}" for i in range(500)),
        denied_by=("U0BOB",),
        version_now="z" * 5000,
        version_after="w" * 5000,
        expires_at=datetime(2026, 1, 1, tzinfo=UTC),
        steps=steps,
        summary="s" * 50_000,
        cancel_requested_by="U0CAROL",
        notes=("n" * 9000,) * 20,
        gpu_health=tuple(
            HealthNote(f"gpu-{i}", Level.CRITICAL, "<!channel> " + "c" * 5000) for i in range(200)
        ),
    )


@pytest.mark.parametrize("status", STATUSES)
def test_cards_with_huge_inputs_stay_within_limits(status: RunStatus) -> None:
    assert_within_limits(run_card(huge_view(status)))
    assert_within_limits(outcome_reply(huge_view(status)))


def test_pending_card_shows_the_plan_and_the_buttons() -> None:
    view = CardView(
        run_id=3,
        plan=plan(),
        requested_by="U0ALICE",
        status=RunStatus.PENDING_APPROVAL,
        needed=2,
        approvals=("U0BOB",),
        expires_at=datetime(2026, 1, 1, 12, 0, tzinfo=UTC),
    )
    msg = run_card(view)
    assert_within_limits(msg)
    text = str(msg.blocks)
    for part in (
        "gpu-0",
        "vllm.service",
        "vllm==0.16.0",
        "nightly",
        "<@U0ALICE>",
        "<@U0BOB>",
        "1 of 2",
        "unknown until preflight",
        "systemctl stop vllm",
        "<!date^1767268800^",
    ):
        assert part in text, part
    actions = msg.blocks[-1]
    assert [e["text"]["text"] for e in actions["elements"]] == ["Approve", "Deny"]
    assert {e["value"] for e in actions["elements"]} == {"3"}


def test_the_pending_card_shows_a_line_per_host_whose_gpus_are_not_all_ok() -> None:
    notes = (
        HealthNote(
            "gpu-0",
            Level.CRITICAL,
            "gpu-0: GPU 3 critical: a row remap is "
            "pending (reset the GPU). The preflight will refuse the run on gpu-0",
        ),
        HealthNote("gpu-1", None, "gpu-1: unknown (<no answer>)"),
        HealthNote("gpu-2", Level.WARN, "gpu-2: GPU 1 warn: Xid 13 (restart the application)"),
    )
    view = CardView(
        run_id=3,
        plan=plan(hosts=3),
        requested_by="U0ALICE",
        status=RunStatus.PENDING_APPROVAL,
        gpu_health=notes,
    )
    msg = run_card(view)
    assert_within_limits(msg)
    (health,) = [b for b in msg.blocks if "GPU health:" in str(b)]
    assert health["text"]["text"] == (
        ":no_entry: GPU health: gpu-0: GPU 3 critical: a row remap is pending (reset the "
        "GPU). The preflight will refuse the run on gpu-0\n"
        ":grey_question: GPU health: gpu-1: unknown (&lt;no answer&gt;)\n"
        ":warning: GPU health: gpu-2: GPU 1 warn: Xid 13 (restart the application)"
    )
    # Above the commands, where an approver reads first.
    assert msg.blocks.index(health) < next(
        i for i, b in enumerate(msg.blocks) if "Commands, on each host" in str(b)
    )
    # Read at the request, for the approval: the running card has its GPU check step.
    running = run_card(
        CardView(
            run_id=3,
            plan=plan(hosts=3),
            requested_by="U0ALICE",
            status=RunStatus.RUNNING,
            gpu_health=notes,
        )
    )
    assert "GPU health:" not in str(running.blocks)
    assert gpu_health_blocks(()) == []


def test_gpu_health_of_a_large_fleet_stays_within_its_sections() -> None:
    notes = [
        HealthNote(f"gpu-{i}", Level.WARN, f"gpu-{i}: GPU 0 warn: " + "w" * 400) for i in range(100)
    ]
    blocks = gpu_health_blocks(notes)
    assert 1 < len(blocks) <= 3
    assert all(len(b["text"]["text"]) <= MAX_SECTION_TEXT for b in blocks)
    assert blocks[0]["text"]["text"].startswith(":warning: GPU health: gpu-0: GPU 0 warn: ")
    assert "more lines not shown" in blocks[-1]["text"]["text"]


def test_status_card_has_a_checklist_and_cancel_until_the_end() -> None:
    p = plan(hosts=2)
    steps = list(initial_steps(p))
    steps[0] = StepLine("gpu-0", Step.PREFLIGHT, StepStatus.OK, 1.5, "fine")
    steps[1] = StepLine("gpu-0", Step.STOP, StepStatus.RUNNING)
    running = CardView(
        run_id=3,
        plan=p,
        requested_by="U0ALICE",
        status=RunStatus.RUNNING,
        approvals=("U0BOB",),
        steps=tuple(steps),
    )
    msg = run_card(running)
    text = str(msg.blocks)
    assert ":white_check_mark: Preflight" in text and "(1.5s) — fine" in text
    assert ":hourglass_flowing_sand: *Stop service*" in text and "*gpu-1*" in text
    assert msg.blocks[-1]["elements"][0]["text"]["text"] == "Cancel"
    done = run_card(
        CardView(
            run_id=3,
            plan=p,
            requested_by="U0ALICE",
            status=RunStatus.SUCCEEDED,
            steps=tuple(steps),
            summary="vllm 0.15.1 -> 0.16.0, healthy",
        )
    )
    assert all(b["type"] != "actions" for b in done.blocks)
    assert "vllm 0.15.1 -&gt; 0.16.0, healthy" in str(done.blocks)


def test_host_text_cannot_ping_or_close_the_code_block() -> None:
    code, _ = code_tail("ok\n<!channel> ``` *bold* <@U123>")
    assert "<!channel>" not in code and "<@U123>" not in code
    assert code.count("```") == 2
    line = StepLine("h", Step.STOP, StepStatus.FAILED, 1.0, "<!here> & <https://evil|x>")
    assert "<!here>" not in str(step_reply(line, "", full_log_attached=False).blocks)
    assert escape("a<b>&c") == "a&lt;b&gt;&amp;c"


# Issue 17 F9: host text in a message's fallback text (what a notification shows, read as
# mrkdwn there too) must not ping, mention or link any more than in its blocks.
HOSTILE = "VLLM::<!channel> <@U123> & <http://evil.example|click> <!subteam^S1>"


@pytest.mark.parametrize("build", [leftovers_reply, notice_reply])
def test_host_text_in_a_fallback_text_cannot_ping_or_link(build: Callable[[str], Message]) -> None:
    msg = build(f"gpu-node-1: PID 48304 ({HOSTILE}) holds GPU 3")
    for raw in ("<!channel>", "<@U123>", "<http", "<!subteam", "& "):
        assert raw not in msg.text, (raw, msg.text)
    assert "&lt;!channel&gt; &lt;@U123&gt; &amp; &lt;http://evil.example|click&gt;" in msg.text
    # A plain list keeps reading as it was written.
    assert build("PID 48304 (VLLM::Worker_TP3)").text.endswith("PID 48304 (VLLM::Worker_TP3)")
    assert_within_limits(build(HOSTILE * 400))


def test_code_tail_keeps_the_end_and_head_keeps_the_start() -> None:
    lines = "\n".join(f"line {i}" for i in range(100_000))
    tail, cut = code_tail(lines)
    assert cut and len(tail) <= MAX_SECTION_TEXT and "line 99999" in tail
    assert "\nline 9" in tail and "(earlier output cut)" in tail
    head, cut = code_head(lines)
    assert cut and len(head) <= MAX_SECTION_TEXT and "line 0\n" in head
    small, cut = code_tail("just this")
    assert not cut and small == "```\njust this\n```"


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=20_000), st.text(max_size=400))
def test_answers_stay_within_limits_for_any_text(body: str, title: str) -> None:
    line = StepLine(title or "h", Step.REINSTALL, StepStatus.OK, 0.1, title)
    for msg in (
        code_answer(title, body),
        tail_answer(title, body),
        step_reply(line, body, full_log_attached=True),
        code_pages_answer(title, body, rest="see the CLI"),
    ):
        assert_within_limits(msg)


def test_an_answer_without_a_file_keeps_every_line_it_can_and_says_what_is_left() -> None:
    # /vllm doctor answers ephemerally (issue 17 F10), where no file can follow: the table
    # goes in code blocks split between lines, and the rest is counted, never dropped unsaid.
    table = "\n".join(
        f"gpu-node-{i:03d}  kimi-k25  sudo rules  FAIL  missing rule" for i in range(900)
    )
    msg = code_pages_answer("doctor: all hosts: checks FAILED", table, rest="run the CLI")
    assert_within_limits(msg)
    shown = "\n".join(b["text"]["text"] for b in msg.blocks if b["type"] == "section")
    kept = [n for n in range(900) if f"gpu-node-{n:03d} " in shown]
    assert kept == list(range(len(kept))) and 0 < len(kept) < 900
    assert f"… {900 - len(kept)} more lines not shown: run the CLI" in str(msg.blocks[-1])
    small = code_pages_answer("doctor: host h1: all checks passed", "a\nb", rest="x")
    assert [b["type"] for b in small.blocks] == ["section", "section"]


def test_a_card_cut_to_fit_keeps_each_hosts_list_with_its_button_and_cancel() -> None:
    # Issue 17 F5: each host's list has its own button beside it, even on a card whose
    # checklist does not fit; a batch larger than the card shows waits its turn, said so.
    asks = tuple(
        LeftoverAsk(
            f"gpu-{i}",
            f"q{i}",
            f"gpu-{i}: 9 processes ...\n- PID {i}",
            (48253 + i,),
            needed=2,
            approvals=("U0BOB",) if i else (),
        )
        for i in range(12)
    )
    view = dataclasses.replace(
        huge_view(RunStatus.RUNNING), leftovers=asks, cancel_requested_by=None
    )
    card = run_card(view)
    assert_within_limits(card)
    beside = [b for b in card.blocks if "accessory" in b]
    assert [b["accessory"]["value"] for b in beside] == [f"7:gpu-{i}:q{i}" for i in range(10)]
    assert all(f"PID {i}" in b["text"]["text"] for i, b in enumerate(beside))
    assert "*gpu-0*: 1 process · 0 of 2 approvals\n" in beside[0]["text"]["text"]
    assert "*gpu-1*: 1 process · 1 of 2 approvals (<@U0BOB>)" in beside[1]["text"]["text"]
    assert "PIDs 48254 on gpu-1" in str(beside[1]["accessory"]["confirm"])
    assert "2 more host(s) wait with leftover processes" in str(card.blocks)
    assert card.blocks[-1]["elements"][0]["action_id"] == "cancel"
    # Cut to 50 blocks, every block with a button stays, in its place.
    many = [section(f"line {i}") for i in range(60)]
    blocks = [*many[:30], *beside[:3], *many[30:], card.blocks[-1]]
    cut_card = message("t", blocks)
    assert_within_limits(cut_card)
    assert [b for b in cut_card.blocks if "accessory" in b] == beside[:3]
    assert cut_card.blocks[-1] == card.blocks[-1]
    assert "… 15 more blocks not shown" in str(cut_card.blocks)  # 60 - (50 - 1 - 4)
