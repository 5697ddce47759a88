"""``doctor``: what each answer means. ``judge`` turns a probe's ``Answer`` into a
``Check``: ok, warn or fail, with what to do about it. The sudo and authorized_keys
judges have their own modules (``doctor_sudo``, ``doctor_keys``); the others are here."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bot.core import doctor_keys, doctor_sudo, remote
from bot.core.doctor_types import (
    SUDOERS_FIX,
    Answer,
    Check,
    Outcome,
    Probe,
    failed,
    judged,
    reply,
)
from bot.core.gpu import check_nvidia_smi, driver_warnings, parse_gpu_csv
from bot.core.releases import layout_refusal, parse_releases
from bot.core.results import CommandResult
from bot.core.routers import doctor as router_doctor
from bot.core.unit_flags import ServeCommand, command_of
from bot.errors import GpuQueryError
from bot.settings import ServiceSettings, Settings


def _login_account(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    if cfg.is_local:
        return judged(p, Outcome.OK, "local: commands run as the bot's own account")
    if cfg.user == "root":
        return judged(
            p,
            Outcome.WARN,
            "logs in as root: whoever holds the bot's key owns this host",
            'log in as an ordinary account with become = "sudo" (README: non-root hosts)',
        )
    how = (
        "sudo for what needs rights"
        if cfg.become == "sudo"
        else "no sudo: the account must own the unit and the venv"
    )
    return judged(p, Outcome.OK, f"logs in as {cfg.user}, {how}")


def _tcp(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    if a.error:
        return judged(
            p,
            Outcome.FAIL,
            f"{cfg.address}:{cfg.port}: {a.error}",
            f"check hosts.{p.host}.address and port, the network path, and that "
            "sshd runs on the host",
        )
    return judged(p, Outcome.OK, f"{cfg.address}:{cfg.port} accepts connections")


def _host_key(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    scan = (
        f"verify the key out of band, then add it: `ssh-keyscan -p {cfg.port} "
        f"{cfg.address} >> {cfg.known_hosts}` (compare `ssh-keygen -lf` with the host)"
    )
    if a.error or a.key is None:
        return judged(p, Outcome.FAIL, f"no host key read: {a.error}", scan)
    trusted = [t for t in a.trusted.split(",") if t.startswith("SHA256:")]
    if a.trusted.startswith("cert-authority") and not trusted:
        return judged(p, Outcome.OK, f"{a.key}, signed by a trusted authority (checked at login)")
    if not trusted:
        return judged(
            p,
            Outcome.FAIL,
            f"{cfg.known_hosts} has no entry for "
            f"[{cfg.address}]:{cfg.port} (the host presents {a.key})",
            scan,
        )
    if a.key not in trusted:
        return judged(
            p,
            Outcome.FAIL,
            f"the host presents {a.key}, but {cfg.known_hosts} "
            f"trusts {', '.join(trusted)}: changed, or not the host you meant",
            "find out why the key changed before trusting the new one; then "
            f"replace the entry (`ssh-keygen -R '[{cfg.address}]:{cfg.port}' -f "
            f"{cfg.known_hosts}`, then add the verified key)",
        )
    return judged(p, Outcome.OK, f"{a.key} matches {cfg.known_hosts}")


def _ssh_login(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    r = a.results[0] if a.results else None
    if a.error or r is None or not r.ok:
        why = a.error or (reply(r) if r else "no answer")
        return judged(
            p,
            Outcome.FAIL,
            why,
            f"put the bot's public key ({cfg.key_file}.pub) "
            f"in ~{cfg.user}/.ssh/authorized_keys on the host, restricted (README)",
        )
    return judged(p, Outcome.OK, f"key accepted for {r.stdout.strip() or cfg.user}")


def _uv(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.service is not None
    r = failed(p, a) if a.results else None
    if a.error or r is not None or not a.results:
        return judged(
            p,
            Outcome.FAIL,
            a.error or (reply(r) if r else "no answer"),
            f"install uv on the host, or set services.{p.service}.uv to its path",
        )
    return judged(p, Outcome.OK, a.results[0].stdout.strip() or "uv answers")


def _nvidia_smi(p: Probe, a: Answer, s: Settings) -> Check:
    r = a.results[0] if a.results else None
    fix = "check the NVIDIA driver: `nvidia-smi` on the host must list the GPUs"
    if a.error or r is None:
        return judged(p, Outcome.FAIL, a.error or "no answer", fix)
    # The GPU query's own judge, as the runs use it: a corrupted infoROM's warning (exit 14
    # with good rows) is a warning here too, not a failure that a run would not see.
    try:
        check_nvidia_smi(p.host, r)
        gpus = parse_gpu_csv(p.host, r.stdout)
    except GpuQueryError as e:
        return judged(p, Outcome.FAIL, e.reason if r.ok else reply(r), fix)
    found = f"{len(gpus)} GPU(s)" + (f": {gpus[0].name}" if gpus else "")
    warnings = driver_warnings(r.stdout, r.stderr)
    if warnings:
        return judged(
            p,
            Outcome.WARN,
            f"{found}; " + "; ".join(w.line for w in warnings),
            "the GPU's infoROM is corrupted: its ECC and health records may be "
            "unreliable; plan an infoROM recovery or RMA with NVIDIA",
        )
    return judged(p, Outcome.OK, found)


def _unit(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.service is not None
    svc = s.services[p.service]
    r = a.results[0] if a.results else None
    if a.error or r is None or not r.ok:
        return judged(
            p,
            Outcome.FAIL,
            a.error or (reply(r) if r else "no answer"),
            "" if r is None or not r.refused else SUDOERS_FIX.format(user=s.hosts[p.host].user),
        )
    props = remote.parse_unit_show(r.stdout)
    if props.get("LoadState") != "loaded":
        return judged(
            p,
            Outcome.FAIL,
            f"{svc.unit}: LoadState={props.get('LoadState', '?')}",
            f"check services.{p.service}.unit against `systemctl list-units "
            "--all 'vllm*'` on the host",
        )
    state = f"{svc.unit}: {props.get('ActiveState', '?')} ({props.get('SubState', '?')})"
    user = a.results[1].stdout.strip() if len(a.results) > 1 and a.results[1].ok else None
    if (
        s.hosts[p.host].become == "sudo"
        and svc.venv_user
        and user is not None
        and user in ("", "root")
    ):
        # The venv's owner writes the code the unit runs: with the unit as root, the
        # owner's rules (and so the bot's key) reach root through the venv.
        return judged(
            p,
            Outcome.WARN,
            f"{state}, runs as root (no User=): {svc.venv_user} "
            "writes the venv it runs, so the bot's key reaches root through it",
            f"set User= in {svc.unit} to an account other than root (the venv's "
            "owner may read it; it must not be an admin)",
        )
    return judged(p, Outcome.OK, state + (f", runs as {user}" if user else ""))


def _venv(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.service is not None
    svc = s.services[p.service]
    if a.error or len(a.results) < 2:
        return judged(p, Outcome.FAIL, a.error or "no answer")
    exists, show = a.results[:2]
    if not exists.ok:
        return judged(
            p,
            Outcome.FAIL,
            f"no interpreter at {svc.python}",
            f"set services.{p.service}.python to the venv's bin/python",
        )
    version = remote.parse_package_version(show.stdout) if show.ok else None
    if version is None:
        return judged(
            p,
            Outcome.FAIL,
            f"{svc.package} is not installed in {svc.venv_dir} ({reply(show)})",
            f"install {svc.package} into the venv once by hand",
        )
    ok = f"{svc.python}: {svc.package} {version}"
    cfg = s.hosts[p.host]
    if cfg.user == "root" and cfg.become == "none" and not cfg.is_local:
        return _root_mode_owners(p, svc, a.results[2] if len(a.results) > 2 else None, ok)
    return judged(p, Outcome.OK, ok)


def _root_mode_owners(p: Probe, svc: ServiceSettings, r: CommandResult | None, ok: str) -> Check:
    """As root, the bot starts the venv's interpreter (uv, the import gate) and writes
    beside it: a venv another account can write runs that account's code as root (a
    .pth file), and the snapshot is not written into a .chatops root does not own
    (issue 17, F8). Who owns them, when stat cannot say, is not known to be root."""
    owners: dict[str, str] = {}
    for line in (r.stdout if r else "").splitlines():
        owner, sep, path = line.partition(" ")
        if sep:
            owners[path] = owner
    venv_owner = owners.get(svc.venv_dir)
    others = [f"{owner} owns {path}" for path, owner in owners.items() if owner != "root"]
    if venv_owner is None or others:
        said = reply(r) if r else "no answer"
        why = "; ".join(others) or f"cannot tell who owns {svc.venv_dir} ({said})"
        return judged(
            p,
            Outcome.WARN,
            f"{ok}; the bot logs in as root and {why}: code that "
            "account writes into the venv (a .pth file) runs as root whenever uv or "
            "the import gate starts its interpreter, and the snapshot is not written "
            "into a directory root does not own",
            f'log in as an ordinary account with become = "sudo" and venv_user = '
            f'"{venv_owner or "vllm"}" (README: non-root hosts), or make root own '
            f"{svc.venv_dir} and {remote.state_dir(svc)}",
        )
    return judged(p, Outcome.OK, f"{ok}, owned by root")


def _health(p: Probe, a: Answer, s: Settings) -> Check:
    h = a.http
    if a.error or h is None or not h.ok:
        why = a.error or (h.error or f"HTTP {h.status}" if h else "no answer")
        return judged(
            p,
            Outcome.FAIL,
            f"{p.url}: {why}",
            f"check services.{p.service}.health_url (fetched on the host), that "
            "the service runs, and that the key's permitopen= in authorized_keys "
            "names its host:port exactly",
        )
    return judged(p, Outcome.OK, f"{p.url}: HTTP 200")


def _disk(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.service is not None
    svc = s.services[p.service]
    r = a.results[0] if a.results else None
    avail = remote.parse_df_avail_mib(r.stdout) if r is not None and r.ok else None
    if a.error or avail is None:
        return judged(
            p,
            Outcome.FAIL,
            a.error
            or f"cannot read free space of {svc.venv_dir}" + (f" ({reply(r)})" if r else ""),
        )
    if avail < svc.min_free_disk_mib:
        return judged(
            p,
            Outcome.FAIL,
            f"{avail:,} MiB free on {svc.venv_dir}, below "
            f"min_free_disk_mib ({svc.min_free_disk_mib:,})",
            "free space on the venv's file system (uv's cache is a usual suspect)",
        )
    return judged(p, Outcome.OK, f"{avail:,} MiB free (min {svc.min_free_disk_mib:,})")


def _unit_command(p: Probe, a: Answer, s: Settings) -> Check:
    """The unit's command line (``ExecStart``): a side-by-side service's must run through
    the venv's link (else a switch changes nothing the unit starts: issue 20, item 3);
    whether a redeploy can check its flags against the new version (item 2: a unit that
    starts a wrapper cannot be, which a redeploy says only once it runs)."""
    assert p.service is not None
    svc = s.services[p.service]
    r = a.results[0] if a.results else None
    if a.error or r is None or not r.ok:
        return judged(
            p,
            Outcome.WARN,
            a.error or "cannot read the unit's ExecStart" + (f" ({reply(r)})" if r else ""),
        )
    command = command_of(remote.parse_unit_show(r.stdout).get("ExecStart", ""))
    link = f"{svc.venv_dir}/"
    if (
        svc.strategy == "side_by_side"
        and isinstance(command, ServeCommand)
        and not command.executable.startswith(link)
    ):
        return judged(
            p,
            Outcome.FAIL,
            f"ExecStart runs {command.executable}, not through {svc.venv_dir}: switching "
            "the link would not change what the unit starts",
            f"make the unit's ExecStart run {svc.venv_dir}/bin/vllm (the link), not a "
            "release's own path",
        )
    if isinstance(command, str):
        # A wrapper: neither its flags nor (side by side) the path it starts can be read.
        through = (
            f"; whether it starts {svc.venv_dir}/bin/vllm cannot be told either"
            if svc.strategy == "side_by_side"
            else ""
        )
        return judged(
            p,
            Outcome.WARN,
            f"flags not checkable: {command}{through}",
            "a flag a new vLLM dropped then shows only when it starts (after the stop); "
            "start `vllm serve` from the unit itself so each redeploy checks its flags first",
        )
    return judged(
        p,
        Outcome.OK,
        f"`vllm serve` with {len(command.flags)} flags: each redeploy checks them against "
        "the new version's `vllm serve --help=all` before the stop",
    )


def _releases(p: Probe, a: Answer, s: Settings) -> Check:
    """A side-by-side service: its venv path is a link to a complete release in its
    releases directory (issue 20, item 3)."""
    assert p.service is not None
    svc = s.services[p.service]
    r = a.results[0] if a.results else None
    layout = parse_releases(r.stdout, svc.venv_dir) if r is not None and r.ok else None
    refusal = layout_refusal(svc, layout, a.error or (reply(r) if r is not None else "no answer"))
    if refusal is not None or layout is None:
        return judged(
            p,
            Outcome.FAIL,
            refusal or "no listing",
            f"convert {svc.venv_dir} into a link to a release in {svc.releases_dir} "
            "(README: side-by-side releases, converting an in-place venv), and make the "
            f"unit's ExecStart run {svc.venv_dir}/bin/...",
        )
    return judged(
        p,
        Outcome.OK,
        f"{svc.venv_dir} -> {layout.target}; {len(layout.releases)} release(s), "
        f"keep_releases {svc.keep_releases}",
    )


_JUDGES: dict[str, Callable[[Probe, Answer, Settings], Check]] = {
    "login account": _login_account,
    "tcp": _tcp,
    "host key": _host_key,
    "ssh login": _ssh_login,
    "nvidia-smi": _nvidia_smi,
    "uv": _uv,
    "unit": _unit,
    "unit command": _unit_command,
    "venv": _venv,
    "releases": _releases,
    "health": _health,
    "disk": _disk,
    **doctor_sudo.JUDGES,
    **doctor_keys.JUDGES,
    **router_doctor.JUDGES,
}


def judge(probe: Probe, answer: Answer, settings: Settings) -> Check:
    return _JUDGES[probe.name](probe, answer, settings)


def passed(checks: Sequence[Check]) -> bool:
    """Everything passed (a warning is no failure; a skip follows one)."""
    return all(c.outcome in (Outcome.OK, Outcome.WARN) for c in checks)
