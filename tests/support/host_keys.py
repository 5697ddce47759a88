"""Host keys in tests: what OpenSSH's own ``ssh-keygen -lf`` prints for a known_hosts
file, and a known_hosts line with a fresh key for a simulated host's address."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import asyncssh
import pytest

from bot.sim.kit import SimKit


def keygen_fingerprint(known_hosts: Path) -> str:
    """The fingerprint ``ssh-keygen -lf`` prints for the file's only key
    ("256 SHA256:… [127.0.0.1]:2222 (ED25519)"). Skips without ssh-keygen, except in CI."""
    tool = shutil.which("ssh-keygen")
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("ssh-keygen is missing and CI is set: install openssh-client")
        pytest.skip("ssh-keygen is not installed (apt-get install openssh-client)")
    out = subprocess.run(
        [tool, "-lf", str(known_hosts)], check=True, capture_output=True, text=True
    ).stdout
    return out.split()[1]


def key_line(port: int) -> str:
    """A known_hosts line for 127.0.0.1 at ``port`` with a fresh key."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    return f"[127.0.0.1]:{port} {key.export_public_key().decode().strip()}\n"


def other_key_line(kit: SimKit) -> str:
    """A known_hosts line naming the kit's address with a key the kit does not have."""
    return key_line(kit.port)
