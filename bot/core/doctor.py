"""``doctor``: what to check on each host and service, and what each answer means.

``probes`` lists the checks for the configured hosts and services (pure); the edge
(``bot.engine.doctor``) performs each one and hands back an ``Answer``; ``judge`` turns
that into a ``Check``: ok, warn or fail, with what to do about it.  Every probe only
reads: a TCP connect, the host key the server presents, ``id -un``, ``sudo -n -l``,
``uv --version``, ``nvidia-smi``, ``systemctl show``, ``test -x``, ``uv pip show``,
``df`` and a GET of the health URL through the SSH connection.

The pieces: ``doctor_types`` (probe, answer, check), ``doctor_probes`` (what to check),
``doctor_judges`` with ``doctor_sudo`` and ``doctor_keys`` (what the answers mean),
``doctor_report`` (the table). This module names them all, as callers import them.
"""

from __future__ import annotations

from bot.core.doctor_judges import judge, passed
from bot.core.doctor_keys import KEY_FILE_SCRIPT, SSHD_KEYS_SCRIPT, KeyFiles, key_files
from bot.core.doctor_probes import probes
from bot.core.doctor_report import render
from bot.core.doctor_sudo import parse_sudo_defaults, parse_sudo_list, secure_path_for
from bot.core.doctor_types import (
    HOST_TIMEOUT_S,
    SUDOERS_FIX,
    Answer,
    Argv,
    Check,
    Kind,
    Outcome,
    Probe,
    skipped,
)

__all__ = [
    "HOST_TIMEOUT_S",
    "KEY_FILE_SCRIPT",
    "SSHD_KEYS_SCRIPT",
    "SUDOERS_FIX",
    "Answer",
    "Argv",
    "Check",
    "KeyFiles",
    "Kind",
    "Outcome",
    "Probe",
    "judge",
    "key_files",
    "parse_sudo_defaults",
    "parse_sudo_list",
    "passed",
    "probes",
    "render",
    "secure_path_for",
    "skipped",
]
