"""What a person typed, echoed back in a refusal, through the real bolt app: Slack shows
the answer as mrkdwn, so ``<!channel>``, ``<@U…>`` and ``<https://…|…>`` must arrive
escaped (``&lt;`` ``&gt;`` ``&amp;``), never as a mention or a link."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.sim.kit import SimKit
from bot.slack.blocks import escape
from tests.slack_harness import ALICE, slack_bot

# (typed after /vllm, what the refusal must show instead of the raw text)
HOSTILE = [
    ("redeploy <!channel>", "'&lt;!channel&gt;'"),
    ("<!here> please", "'&lt;!here&gt;'"),
    ("restart <@U0BOB>", "'&lt;@U0BOB&gt;'"),
    ("<https://evil.example/login|click-here>", "'&lt;https://evil.example/login|click-here&gt;'"),
    ("logs kimi-k25 -n <!subteam^S0OPS>", "'&lt;!subteam^S0OPS&gt;'"),
    ("status a&b", "'a&amp;b'"),
]


def ack_text(body: str) -> str:
    return str(json.loads(body).get("text", "")) if body.startswith("{") else body


@pytest.mark.parametrize(("typed", "shown"), HOSTILE)
async def test_a_refusal_echoes_what_was_typed_escaped(
    tmp_path: Path, sim_host: SimKit, typed: str, shown: str
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        res = await bot.command(typed)
        assert res.status == 200
        answer = ack_text(res.text)
        assert shown in answer, answer
        # Nothing typed survives as markup: every < and > left is escaped.
        assert "<" not in answer and ">" not in answer, answer
        [row] = await bot.refusals(1)
        # The audit log keeps what was typed, as typed.
        assert row.command == f"/vllm {typed}" and row.user == ALICE
        assert row.reason == answer


def test_escape_is_the_one_function_for_echoed_text() -> None:
    assert escape("<!channel> & <@U1|x>") == "&lt;!channel&gt; &amp; &lt;@U1|x&gt;"
    # Already escaped text is escaped again: Slack shows it as typed.
    assert escape("&lt;") == "&amp;lt;"
