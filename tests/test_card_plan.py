"""Cards never hide what is approved (issue 9): with 64 hosts named like
``gpu-node-NN.dc1.example.internal`` the Host(s) field was cut at 2,000 characters, so
approvers saw 55 of 64 hosts, "(1 at a time)" was gone and the text ended inside an open
backtick. A list that does not fit is summarised truthfully on the card, and the complete
plan is in the card's thread before the card can be approved; nothing is cut mid-token."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.plan import HostTarget, Plan, PlannedStep, Step
from bot.core.status import Action, RunStatus
from bot.sim.kit import SimKit
from bot.slack.blocks import (
    MAX_FIELD_TEXT,
    MAX_MESSAGE_TEXT,
    MAX_SECTION_TEXT,
    CardView,
    Message,
    card_hides_plan,
    cut,
    full_plan,
    full_plan_message,
    run_card,
)
from tests.fakes import validate_blocks
from tests.slack_harness import (
    ALICE,
    BOB,
    CAROL,
    CHANNEL,
    SERVICE,
    SlackBot,
    blocks_text,
    buttons,
    slack_bot,
)
from tests.support.host_keys import keygen_fingerprint, other_key_line
from tests.support.sim import touched

FLEET = tuple(f"gpu-node-{i:02d}.dc1.example.internal" for i in range(1, 65))
KEY = "SHA256:evCCyaxPp92vVpg/Xy3FJa40tiBneE93F9sSxVVKB20"
SUMMARY = (
    "64 hosts: `gpu-node-01.dc1.example.internal` … "
    "`gpu-node-64.dc1.example.internal`, 1 at a time, full list in the thread"
)


def fleet_plan(
    hosts: tuple[str, ...] = FLEET, *, command: str = "systemctl stop vllm", batch: int = 1
) -> Plan:
    steps = tuple(PlannedStep(s, command) for s in (Step.PREFLIGHT, Step.STOP, Step.START))
    targets = tuple(
        HostTarget(h, f"10.1.{i // 250}.{i % 250}", 22, "root", "/etc/chatops/id_ed25519", KEY)
        for i, h in enumerate(hosts)
    )
    return Plan(
        action=Action.REDEPLOY,
        service="kimi-k25",
        hosts=hosts,
        unit="vllm.service",
        package="vllm",
        version="0.31.0",
        spec="vllm==0.31.0",
        index_name=None,
        index_url=None,
        steps=steps,
        batch_size=batch,
        targets=targets,
    )


def texts(blocks: list[dict[str, Any]]) -> list[str]:
    """Every text a person reads in the blocks, each field and element on its own."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("text"), str):
                out.append(value["text"])
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(blocks)
    return out


def balanced(text: str) -> bool:
    """No code block and no inline code span left open (inside a block, a backtick is
    just a character)."""
    if text.count("```") % 2:
        return False
    return re.sub(r"```.*?```", "", text, flags=re.S).count("`") % 2 == 0


def assert_whole(msg: Message) -> None:
    """Within Slack's limits, and no text leaves a code span or block open."""
    assert validate_blocks(msg.blocks) == []
    assert 0 < len(msg.text) <= MAX_MESSAGE_TEXT
    for block in msg.blocks:
        for f in block.get("fields") or ():
            assert len(f["text"]) <= MAX_FIELD_TEXT
        if block["type"] == "section" and "text" in block:
            assert len(block["text"]["text"]) <= MAX_SECTION_TEXT
    for text in texts(msg.blocks):
        assert balanced(text), text


def shown_hosts(msg: Message) -> list[str]:
    """The host names in the Host(s) field, as backticked there."""
    facts = next(b for b in msg.blocks if b.get("fields"))
    hosts = next(f["text"] for f in facts["fields"] if f["text"].startswith("*Host(s)*"))
    return re.findall(r"`([^`]+)`", hosts)


def test_64_hosts_are_summarised_truthfully_and_the_thread_has_them_all() -> None:
    plan = fleet_plan()
    view = CardView(run_id=9, plan=plan, requested_by=ALICE, status=RunStatus.PENDING_APPROVAL)
    card = run_card(view)
    assert_whole(card)
    assert SUMMARY in blocks_text({"blocks": card.blocks})
    assert card_hides_plan(view)
    listing = full_plan_message(9, plan)
    assert listing is not None
    assert_whole(listing)
    text = "\n".join(texts(listing.blocks))
    for i, host in enumerate(FLEET, 1):
        assert f"{i:>2}. {host}  root@10.1.0.{i - 1}:22  host key {KEY}" in text
    assert "Hosts: 64, 1 at a time, in this order:" in text
    assert "systemctl stop vllm" in text


def test_a_plan_that_fits_is_shown_whole_with_nothing_in_the_thread() -> None:
    plan = fleet_plan(FLEET[:3], batch=2)
    card = run_card(
        CardView(run_id=9, plan=plan, requested_by=ALICE, status=RunStatus.PENDING_APPROVAL)
    )
    assert_whole(card)
    text = blocks_text({"blocks": card.blocks})
    for i, host in enumerate(FLEET[:3]):
        assert f"`{host}` root@10.1.0.{i}:22 `{KEY}`" in text
    assert "(2 at a time)" in text and "in the thread" not in text
    assert not card_hides_plan(
        CardView(run_id=9, plan=plan, requested_by=ALICE, status=RunStatus.PENDING_APPROVAL)
    )


def test_a_command_too_long_for_the_card_is_named_not_cut() -> None:
    long = "uv pip install --python /opt/" + "v" * 4000 + "/bin/python vllm==0.31.0"
    plan = fleet_plan(FLEET[:1], command=long)
    view = CardView(run_id=9, plan=plan, requested_by=ALICE, status=RunStatus.PENDING_APPROVAL)
    card = run_card(view)
    assert_whole(card)
    text = blocks_text({"blocks": card.blocks})
    assert "a command of 4,053 characters, too long for the card: in full in the thread" in text
    assert "v" * 100 not in text  # no part of it, which could read as the whole
    assert card_hides_plan(view)
    # One line longer than a code block: the complete plan goes as a file.
    assert full_plan_message(9, plan) is None
    assert long in full_plan(9, plan)


names = st.from_regex(r"[a-z][a-z0-9.-]{0,62}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(
    hosts=st.lists(names, min_size=1, max_size=200, unique=True),
    batch=st.integers(1, 64),
    command=st.text(min_size=1, max_size=5000),
    status=st.sampled_from(list(RunStatus)),
)
def test_no_card_cuts_a_host_or_leaves_a_backtick_open(
    hosts: list[str], batch: int, command: str, status: RunStatus
) -> None:
    plan = fleet_plan(tuple(hosts), command=command, batch=batch)
    view = CardView(run_id=9, plan=plan, requested_by=ALICE, status=status)
    card = run_card(view)
    assert_whole(card)
    shown = shown_hosts(card)
    # Every name on the card is a whole host name (or a whole key), never a part of one.
    assert set(shown) <= set(hosts) | {KEY}
    if card_hides_plan(view):
        everything = full_plan(9, plan)
        assert all(f". {h}  " in everything for h in hosts)
        listing = full_plan_message(9, plan)
        if listing is not None:
            assert_whole(listing)
    else:
        assert [h for h in shown if h != KEY] == hosts


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(
        st.from_regex(r"[A-Za-z0-9.`&<>*_-]{1,40}", fullmatch=True), min_size=1, max_size=300
    ),
    limit=st.integers(1, 3000),
)
def test_a_cut_ends_between_words_and_closes_what_it_opened(words: list[str], limit: int) -> None:
    text = " ".join(words)
    out = cut(text, limit)
    assert len(out) <= limit
    if out == text:
        return
    kept = out.removesuffix("…").rstrip()
    # A whole number of whole words (or, for one giant first word, a part of it).
    assert text.startswith(kept)
    assert kept == "" or len(text) == len(kept) or text[len(kept)] == " " or " " not in kept
    assert balanced(out)


async def _fleet_bot_settings(
    kit: SimKit, tmp_path: Path, *, python: str | None = None
) -> dict[str, Any]:
    # 64 hosts nobody needs to reach: the card is posted at request time.
    hosts = {
        h: {**kit.host_settings(), "address": f"10.1.0.{i}", "port": 22}
        for i, h in enumerate(FLEET, 1)
    }
    overrides = {"python": python} if python is not None else {}
    return {
        "hosts": hosts,
        "services": {SERVICE: kit.service_settings(hosts=list(FLEET), **overrides)},
    }


async def _card_and_thread(bot: SlackBot) -> tuple[int, str, list[dict[str, Any]]]:
    await bot.command(f"redeploy {SERVICE} --version 0.31.0", user=ALICE)
    record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card recorded")
    # The card is recorded (clicks on it count) only once the complete plan is in its
    # thread: by now the thread must hold it.
    thread = await bot.thread(record.id)
    return record.id, blocks_text(await bot.card(record.id)), thread


async def test_a_64_host_request_posts_a_true_summary_and_the_full_list_first(
    tmp_path: Path, sim_host: SimKit
) -> None:
    fleet = await _fleet_bot_settings(sim_host, tmp_path)
    async with slack_bot(tmp_path, sim_host, **fleet) as bot:
        run_id, card, thread = await _card_and_thread(bot)
        assert SUMMARY in card
        assert buttons(await bot.card(run_id)) == ["Approve", "Deny"]
        listing = "\n".join(blocks_text(m) for m in thread)
        assert f"The complete plan of run #{run_id}" in listing
        for i, host in enumerate(FLEET, 1):
            assert f"{i:>2}. {host}  {sim_host.user}@10.1.0.{i}:22  host key unknown" in listing
        for m in [await bot.card(run_id), *thread]:
            for text in texts(m["blocks"]):
                assert balanced(text), text
        # Every message was within Slack's limits (the fake refuses what is not).
        assert all(c.ok for c in bot.fake.calls()), [c for c in bot.fake.calls() if not c.ok]
        await bot.click("deny", run_id, user=CAROL)
        await bot.wait_status(run_id, "denied")
    assert touched(sim_host) == []


async def test_a_plan_too_long_for_a_message_goes_to_the_thread_as_a_file(
    tmp_path: Path, sim_host: SimKit
) -> None:
    python = "/opt/" + "v" * 3000 + "/bin/python"
    fleet = await _fleet_bot_settings(sim_host, tmp_path, python=python)
    async with slack_bot(tmp_path, sim_host, **fleet) as bot:
        run_id, card, thread = await _card_and_thread(bot)
        assert "too long for the card: in full in the thread" in card
        record = await bot.run(run_id)
        [plan_file] = [f for f in bot.fake.files if f.filename == f"run-{run_id}-plan.txt"]
        assert [(c, t) for c, t, _ in plan_file.shares] == [(CHANNEL, record.message_ts)]
        assert all(f". {h}  " in plan_file.text for h in FLEET)
        assert f"--python {python}" in plan_file.text
        assert "is in the file above" in "\n".join(blocks_text(m) for m in thread)


async def test_a_card_whose_full_plan_cannot_be_posted_is_closed_not_approvable(
    tmp_path: Path, sim_host: SimKit
) -> None:
    fleet = await _fleet_bot_settings(sim_host, tmp_path, python="/opt/" + "v" * 3000 + "/py")
    async with slack_bot(tmp_path, sim_host, **fleet) as bot:
        bot.fake.fail_next("files.getUploadURLExternal", "not_allowed_token_type")
        await bot.command(f"redeploy {SERVICE} --version 0.31.0", user=ALICE)
        closed = await bot.wait_for_run(lambda r: r.status == "cancelled", "the closed request")
        assert "could not post the complete plan" in (closed.summary or "")
        note = (await bot.ephemerals_for(ALICE))[-1]["text"]
        assert f"Could not post the complete plan of run #{closed.id}" in note
        await bot.front_end.idle()
        assert buttons(await bot.card(closed.id)) == []
        await bot.click("approve", closed.id, user=BOB)
        assert "already cancelled" in (await bot.ephemerals_for(BOB))[-1]["text"]
        assert (await bot.run(closed.id)).approved_by == []
        assert await bot.runtime.audit.lock_holder(f"service:{SERVICE}") is None
    assert touched(sim_host) == []


async def test_the_card_shows_each_hosts_endpoint_and_key_and_a_swapped_key_refuses(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        await bot.command(f"restart {SERVICE}")
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        card = blocks_text(await bot.card(record.id))
        fingerprint = keygen_fingerprint(sim_host.known_hosts)
        assert (
            f"`{sim_host.hostname}` {sim_host.user}@127.0.0.1:{sim_host.port} `{fingerprint}`"
        ) in card
        sim_host.known_hosts.write_text(other_key_line(sim_host))
        await bot.click("approve", record.id, user=BOB)
        done = await bot.wait_status(record.id, "refused", "succeeded", "failed")
        assert done.status == "refused"
        assert "configuration changed since this plan was approved" in (done.summary or "")
        await bot.front_end.idle()
        assert "configuration changed" in blocks_text(await bot.card(record.id))
        assert len(await bot.refusals(1)) == 1
    assert touched(sim_host) == []
