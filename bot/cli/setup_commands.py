"""The terminal's commands that look at the setup without opening the audit log:
``sudoers`` prints the drop-in, ``doctor`` checks each host and service, ``releases``
lists a side-by-side service's releases. None changes anything."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bot.cli.terminal import visible
from bot.core import sudoers
from bot.core.doctor import passed
from bot.core.doctor import render as render_checks
from bot.core.doctor_config import judge_config
from bot.core.redact import Redactor, masked_json
from bot.engine.doctor import run_doctor
from bot.engine.releases import releases_text
from bot.errors import InputError
from bot.hosts.fleet import resolve_targets
from bot.hosts.pool import HostPool
from bot.settings import USER_RE, Settings, config_path


async def print_sudoers(settings: Settings, args: argparse.Namespace) -> int:
    hosts = args.host
    for h in hosts or ():
        if h not in settings.hosts:
            raise InputError(f"unknown host {h!r} (hosts: {', '.join(sorted(settings.hosts))})")
    if not sudoers.services_on(settings, hosts):
        raise InputError('no service runs on a host with become = "sudo": nothing needs rules')
    user = args.user
    if user is None:
        users = sudoers.login_users(settings, hosts)
        if len(users) != 1:
            raise InputError(f"the hosts log in as {', '.join(users)}: name one with --user")
        user = users[0]
    if not USER_RE.fullmatch(user):
        raise InputError(f"{user!r} is not an account name")
    print(sudoers.render(settings, user, hosts), end="")
    return 0


async def doctor(
    settings: Settings, target: str | None, *, as_json: bool, config: Path | None = None
) -> int:
    """Exit 0 only when every check passed. ``config``: the file named by --config."""
    source = config if config is not None else config_path()
    checks = [
        judge_config(str(source), source.exists(), len(settings.hosts), len(settings.services))
    ]
    hosts = resolve_targets(settings, target)
    service = target if target in settings.services and target not in settings.hosts else None
    pool = HostPool(settings)
    try:
        checks += await run_doctor(settings, pool, hosts, service)
    finally:
        await pool.close()
    redact = Redactor.for_settings(settings)
    if as_json:
        # Masked before serializing: host text ending in `token=` keeps the JSON valid.
        print(visible(json.dumps([masked_json(c.to_json(), redact) for c in checks], indent=1)))
    else:
        print(visible(redact(render_checks(checks))))
    return 0 if passed(checks) else 1


async def releases(settings: Settings, service: str) -> int:
    """Exit 0 only when every host answered with a side-by-side listing."""
    pool = HostPool(settings)
    try:
        text, ok = await releases_text(settings, pool, service)
    finally:
        await pool.close()
    print(visible(Redactor.for_settings(settings)(text)))
    return 0 if ok else 1
