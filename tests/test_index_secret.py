"""An index URL with credentials never appears in a remote argv (security review, issue 9):
every user of a GPU host can read the process list.  It goes to uv on stdin, through a
fixed wrapper, into uv's environment (UV_EXTRA_INDEX_URL), and the card and the audit log
show the index by name."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from bot.core import remote
from bot.core.plan import make_plan
from bot.core.status import Action, RunStatus
from bot.engine.runtime import open_runtime
from bot.hosts.local import LocalTransport
from bot.settings import ServiceSettings, Settings
from bot.sim import procfs
from bot.sim.kit import SimKit
from bot.sim.state import STATE_DIR_ENV
from bot.slack.blocks import CardView, initial_steps, run_card
from tests.polling import eventually
from tests.support.runs import run
from tests.support.sim import sim_settings

TOKEN = "tok-9f8e7d6c5b4a"
PRIVATE = f"https://ci-bot:{TOKEN}@pypi.private.example/simple"
ONLY_ON_PRIVATE = "0.17.0rc1.dev5+g1a2b3c4"


def service(**overrides: object) -> ServiceSettings:
    return ServiceSettings(**{"hosts": ["h1"], "unit": "vllm-kimi", "python": "/opt/v/bin/python",
                              "indexes": {"private": PRIVATE}, **overrides})


def test_install_argv_holds_no_index_and_its_stdin_does() -> None:
    svc = service()
    for argv in (remote.install_dry_run(svc, "vllm==0.17.0", PRIVATE),
                 remote.install(svc, "vllm==0.17.0", PRIVATE),
                 remote.install_previous(svc, "0.16.0", PRIVATE)):
        assert argv[:4] == remote.INDEX_FROM_STDIN and argv[4:7] == ("uv", "pip", "install")
        assert not any("pypi.private" in a or TOKEN in a for a in argv)
        shown = remote.shown(argv)
        assert shown.startswith("UV_EXTRA_INDEX_URL=<index URL, on stdin> uv pip install ")
        assert TOKEN not in shown
    assert remote.index_input(PRIVATE) == f"{PRIVATE}\n".encode()
    # Without an index nothing changes: no wrapper, nothing on stdin.
    assert remote.install(svc, "vllm", None)[0] == "uv" and remote.index_input(None) is None


def test_the_plan_and_the_card_name_the_index_and_never_hold_its_url() -> None:
    settings = Settings(hosts={"h1": {"address": "10.0.0.1", "known_hosts": "/tmp/kh"}},
                        services={"kimi": service().model_dump()})
    plan = make_plan(settings, Action.REDEPLOY, "kimi", version="0.17.0", index="private")
    assert plan.index_url == PRIVATE  # the engine still knows it
    commands = " ".join(s.command for s in plan.steps)
    assert TOKEN not in commands and "UV_EXTRA_INDEX_URL=<index URL, on stdin>" in commands
    card = run_card(CardView(run_id=7, plan=plan, requested_by="U0ALICE",
                             status=RunStatus.PENDING_APPROVAL, steps=initial_steps(plan)))
    text = str(card.blocks) + card.text
    assert TOKEN not in text and "ci-bot" not in text
    assert "`private` (pypi.private.example)" in text


async def test_the_wrapper_passes_any_url_verbatim_and_runs_none_of_it(tmp_path: Path) -> None:
    # Quotes, $(...) and backticks in a URL are data for the fixed script, never code.
    pwned = tmp_path / "pwned"
    hostile = f"https://u:p$(touch {pwned})`touch {pwned}`'\"@h.example/simple; touch {pwned}"
    r = await LocalTransport("local").run(
        (*remote.INDEX_FROM_STDIN, "printenv", remote.INDEX_ENV), timeout_s=10,
        stdin=remote.index_input(hostile))
    assert (r.exit_status, r.stdout) == (0, hostile + "\n")
    assert not pwned.exists()


def _argvs_on_this_machine() -> dict[int, str]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                pass  # gone meanwhile
    return out


async def test_no_process_on_the_host_shows_the_token_and_uv_still_uses_the_index(
        sim_sshd_host: SimKit, tmp_path: Path) -> None:
    kit = sim_sshd_host
    # The private index alone has this version, and only for these credentials.
    kit.update_config(index_url=PRIVATE, index_versions=(ONLY_ON_PRIVATE,))
    kit.set_faults(uv_stalls=True)  # hold the real install while the process list is read
    settings = sim_settings(kit, tmp_path, indexes={"private": PRIVATE})

    def stalled_install() -> int | None:
        for pid in procfs.with_env(STATE_DIR_ENV, str(kit.state_dir)):
            # The simulated uv is `python -S .../bot/sim/forkclient.py uv pip install ...`
            # (what the wrapper's exec became: the process that stands for uv, the one a
            # user of the host sees); `timeout` around it has the same argv after its own.
            argv = procfs.tool_argv(procfs.cmdline(pid)) or []
            if argv[:3] == ["uv", "pip", "install"] and argv[-1:] == [f"vllm=={ONLY_ON_PRIVATE}"] \
                    and "--dry-run" not in argv:
                return pid
        return None

    async with open_runtime(settings) as rt:
        running = asyncio.create_task(run(rt, Action.REDEPLOY, version=ONLY_ON_PRIVATE,
                                          index="private"))
        try:
            pid = await eventually(stalled_install, "the install running on the host")
            # What `ps -ef` shows every user of the host: no process carries the token.
            leaks = {p: a for p, a in _argvs_on_this_machine().items() if TOKEN in a}
            assert leaks == {}
            # uv has the index in its environment, which only its owner can read.
            environ = Path(f"/proc/{pid}/environ")
            assert f"{remote.INDEX_ENV}={PRIVATE}".encode() in environ.read_bytes().split(b"\0")
            assert stat.S_IMODE(os.stat(environ).st_mode) == 0o400
        finally:
            kit.set_faults(uv_stalls=False)
        result, out = await running
        assert result.status == "succeeded", out
        # Only the private index has this version: the install did use it.
        assert kit.installed_version == ONLY_ON_PRIVATE
        assert kit.changes() == ["dry-run", "prefetch", "stop", "install", "start"]
        assert all(TOKEN not in " ".join(c.argv) for c in kit.calls())
        assert TOKEN not in out
        steps = await rt.audit.steps(result.run_id)
        assert all(TOKEN not in s.command for s in steps)
        reinstall = next(s for s in steps if s.step == "reinstall")
        assert reinstall.command.startswith("UV_EXTRA_INDEX_URL=<index URL, on stdin> uv ")


async def test_the_simulated_uv_reads_its_index_from_the_environment_as_uv_does(
        sim_host: SimKit) -> None:
    sim_host.update_config(index_url=PRIVATE, index_versions=(ONLY_ON_PRIVATE,))

    async def dry_run(extra_env: dict[str, str], *flags: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            "uv", "pip", "install", "--python", str(sim_host.python), "--dry-run", *flags,
            f"vllm=={ONLY_ON_PRIVATE}", env={**sim_host.env(), **extra_env},
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, err.decode()

    assert (await dry_run({remote.INDEX_ENV: PRIVATE}))[0] == 0
    assert (await dry_run({"UV_INDEX_URL": PRIVATE}))[0] == 0
    code, err = await dry_run({})
    assert code == 1 and "there is no version of" in err
    # Other credentials are another index: the private versions are not found.
    assert (await dry_run({remote.INDEX_ENV: PRIVATE.replace(TOKEN, "wrong")}))[0] == 1
    # A flag wins over the variable, as with uv's own options.
    assert (await dry_run({remote.INDEX_ENV: PRIVATE}, "--extra-index-url",
                          "https://wheels.vllm.ai/nightly"))[0] == 1
