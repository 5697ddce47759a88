"""The host key each configured host is trusted with, read from its known_hosts file:
what an approved plan binds (``bot.core.plan.HostTarget.host_key``), so a key swapped
in the file between approval and execution refuses the run instead of running unseen.

The lookup is asyncssh's own (``SSHKnownHosts.match``, the matching its ``connect``
does): ``[address]:port`` first for a port other than 22, then the bare address, with
hashed entries and patterns as OpenSSH writes them. A DNS name is matched as written,
never resolved (the plan is built while a person waits): an entry written only for the
address it resolves to reads as unknown here, though ssh would accept it.

Fingerprints are SHA256, as ``ssh-keygen -lf`` prints them (``SHA256:`` and unpadded
base64). A host with no usable entry, or whose file cannot be read, binds
``UNKNOWN_HOST_KEY``.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from pathlib import Path

import asyncssh

from bot.core.plan import UNKNOWN_HOST_KEY
from bot.settings import HostSettings, Settings

log = logging.getLogger(__name__)

DEFAULT_SSH_PORT = 22


def _ip_or_empty(address: str) -> str:
    """``address`` when it is an IP literal (asyncssh's ``addr``), else ''."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return ""
    return address


def _read(path: Path) -> asyncssh.SSHKnownHosts | None:
    try:
        return asyncssh.read_known_hosts(str(path))
    except (OSError, ValueError, asyncssh.Error) as exc:
        # The connection would fail the same way; the card says "unknown".
        log.warning("cannot read known_hosts %s: %s", path, exc)
        return None


def host_key_of(cfg: HostSettings, known: asyncssh.SSHKnownHosts | None = None) -> str:
    """The SHA256 fingerprint(s) ``cfg``'s known_hosts file trusts for its address and
    port, sorted and comma-separated (a host may have an ed25519 and an RSA key);
    a certificate authority's key reads ``cert-authority SHA256:…``. Revoked keys are
    left out. UNKNOWN_HOST_KEY when nothing matches or the file cannot be read.
    ``known``: the file already read."""
    if cfg.is_local or cfg.known_hosts is None:
        return UNKNOWN_HOST_KEY
    if known is None:
        known = _read(cfg.known_hosts)
        if known is None:
            return UNKNOWN_HOST_KEY
    port = cfg.port if cfg.port != DEFAULT_SSH_PORT else None
    host_keys, ca_keys, revoked, *_ = known.match(cfg.address, _ip_or_empty(cfg.address), port)
    revoked_prints = {k.get_fingerprint("sha256") for k in revoked}
    prints = sorted({k.get_fingerprint("sha256") for k in host_keys} - revoked_prints)
    prints += sorted(f"cert-authority {k.get_fingerprint('sha256')}" for k in ca_keys)
    return ",".join(prints) or UNKNOWN_HOST_KEY


def trusted_algorithms(cfg: HostSettings) -> list[str]:
    """The key types ``cfg``'s known_hosts trusts for it (``ssh-ed25519``...): what to ask
    the server for when checking its key (``doctor``); empty when it trusts none."""
    if cfg.is_local or cfg.known_hosts is None:
        return []
    known = _read(cfg.known_hosts)
    if known is None:
        return []
    port = cfg.port if cfg.port != DEFAULT_SSH_PORT else None
    host_keys, *_ = known.match(cfg.address, _ip_or_empty(cfg.address), port)
    return sorted({k.get_algorithm() for k in host_keys})


def host_keys(settings: Settings, hosts: Iterable[str]) -> dict[str, str]:
    """``host_key_of`` for each configured host among ``hosts``, each known_hosts file
    read once (a fleet usually shares one): small local files, read while the plan is
    built."""
    files: dict[Path, asyncssh.SSHKnownHosts | None] = {}
    out: dict[str, str] = {}
    for name in hosts:
        cfg = settings.hosts.get(name)
        if cfg is None:
            continue
        if cfg.is_local or cfg.known_hosts is None:
            out[name] = host_key_of(cfg)
            continue
        if cfg.known_hosts not in files:
            files[cfg.known_hosts] = _read(cfg.known_hosts)
        known = files[cfg.known_hosts]
        out[name] = host_key_of(cfg, known) if known is not None else UNKNOWN_HOST_KEY
    return out
