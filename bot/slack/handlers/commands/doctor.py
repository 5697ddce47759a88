"""``/vllm doctor [host|service]``: the setup checks of ``python -m bot doctor``, as one
table for the asker only (an ephemeral answer; issue 17 F10).

Read-only, but it tells whoever asks how the hosts are set up (accounts, sudo rules,
paths, what fails), so it is open to requesters only, and the answer is theirs: posted in
the channel, it showed everyone there where the hosts are weak. An ephemeral answer
cannot carry a file, so a table too long for one message ends saying how much is left
and where to read the whole of it.
"""

from __future__ import annotations

from bot.core.doctor import passed, render
from bot.core.policy import is_requester
from bot.engine.doctor import run_doctor
from bot.engine.run_results import Refusal
from bot.hosts.fleet import resolve_targets
from bot.slack.blocks import code_pages_answer
from bot.slack.grammar import Doctor
from bot.slack.handlers.common import CommandRequest

WHOLE = "`python -m bot doctor` on the bot's machine prints the whole table."


async def handle(req: CommandRequest, cmd: Doctor) -> None:
    front_end = req.front_end
    # A service's doctor is that service's requesters' (issue 22); a host's or the whole
    # fleet's shows more than one service's setup, so [policy] decides.
    service = cmd.target if cmd.kind == "service" else None
    policy = req.settings.policy if service is None else req.settings.policy_for(service)
    if not is_requester(req.user, policy, await front_end.membership()):
        whose = "the requesters list" + (f" for {service}" if service else "")
        reason = (
            f"You are not on {whose}, so you cannot run doctor (it shows how "
            "the hosts are set up). Ask someone who is, or an admin to add you."
        )
        await req.reply_now(reason)
        front_end.spawn(
            front_end.refuse(
                user=req.user,
                channel=req.channel,
                command=req.typed,
                reason=reason,
                code=Refusal.NOT_REQUESTER,
            ),
            name="refusal",
        )
        return
    hosts = resolve_targets(req.settings, cmd.target)
    await req.ack()

    async def work() -> None:
        checks = await run_doctor(req.settings, req.pool, hosts, service)
        verdict = "all checks passed" if passed(checks) else "checks FAILED"
        title = f"doctor: {cmd.kind} {cmd.target}" if cmd.target else "doctor: all hosts"
        await req.tell_message(code_pages_answer(f"{title}: {verdict}", render(checks), rest=WHOLE))

    req.later(work(), "doctor")
