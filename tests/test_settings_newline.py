"""A config value with a trailing newline is refused, for each kind of value that reaches
a shell, a sudoers file or a socket.

Python's ``$`` also matches just before a final newline, so a validator written as
``re.match(r"^...$")`` let ``"vllm_kimi\\n"`` through: a backend name that reached
HAProxy's admin socket as the end of a line, a unit or a tool path that reached a
sudoers rule as the end of one. Every validator now uses ``fullmatch``."""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bot.cli.main import main
from bot.settings import Settings, maintenance_path_problem

UUID = "GPU-8f6e1c2a-3b4d-5e6f-7a8b-9c0d1e2f3a4b"


def base() -> dict[str, Any]:
    """Every kind of value below, valid: two sudo hosts, a service behind an HAProxy
    router, its GPUs by UUID, an index, approvers."""
    return {
        "policy": {"requesters": ["U0123ABC"], "approvers": ["U0456DEF"]},
        "hosts": {
            name: {"address": address, "known_hosts": "/k", "user": "vllm-bot", "become": "sudo"}
            for name, address in (
                ("gpu-node-1", "10.0.0.1"),
                ("gpu-node-2", "10.0.0.2"),
                ("lb-1", "10.0.0.9"),
            )
        },
        "maintenance": {"systemctl": "/usr/bin/systemctl", "nvidia_smi": "/usr/bin/nvidia-smi"},
        "services": {
            "kimi": {
                "hosts": ["gpu-node-1", "gpu-node-2"],
                "unit": "vllm-kimi.service",
                "python": "/opt/venvs/vllm/bin/python",
                "uv": "/usr/local/bin/uv",
                "systemctl": "/usr/bin/systemctl",
                "journalctl": "/usr/bin/journalctl",
                "ps": "/usr/bin/ps",
                "kill": "/usr/bin/kill",
                "package": "vllm[flashinfer]",
                "venv_user": "vllm",
                "gpus": [UUID],
                "indexes": {"internal": "https://pypi.example/simple"},
                "router": "front",
                "router_servers": {"gpu-node-1": "node1", "gpu-node-2": "node2"},
            }
        },
        "routers": {
            "front": {
                "kind": "haproxy",
                "host": "lb-1",
                "socket": "/run/haproxy/admin.sock",
                "backend": "vllm_kimi",
                "socat": "/usr/bin/socat",
            },
            "cmd": {
                "kind": "command",
                "host": "lb-1",
                "drain": ["/usr/local/bin/lb", "drain", "{server}"],
                "undrain": ["/usr/local/bin/lb", "undrain", "{server}"],
            },
        },
    }


def _at(data: dict[str, Any], path: tuple[str | int, ...]) -> tuple[Any, str | int]:
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    return node, path[-1]


# (where the value sits, what it reaches)
VALUES: list[tuple[tuple[str | int, ...], str]] = [
    (("services", "kimi", "unit"), "systemctl and journalctl as root, a sudoers rule"),
    (("services", "kimi", "package"), "uv's argv, a sudoers rule"),
    (("services", "kimi", "venv_user"), "sudo -u, a sudoers rule"),
    (("services", "kimi", "ps"), "the leftover script's rule, run as root"),
    (("services", "kimi", "kill"), "the leftover script's rule, run as root"),
    (("services", "kimi", "uv"), "a sudoers rule"),
    (("services", "kimi", "systemctl"), "a sudoers rule"),
    (("services", "kimi", "journalctl"), "a sudoers rule"),
    (("services", "kimi", "python"), "a sudoers rule"),
    (("services", "kimi", "gpus", 0), "nvidia-smi -i"),
    (("services", "kimi", "router_servers", "gpu-node-1"), "HAProxy's admin socket"),
    (("routers", "front", "backend"), "HAProxy's admin socket, the HAProxy rule"),
    (("routers", "front", "socket"), "socat's address, the HAProxy rule"),
    (("routers", "front", "socat"), "the HAProxy rule, run as root"),
    (("routers", "cmd", "drain", 0), "the router command run on its host (as the login)"),
    (("policy", "approvers", 0), "Slack's API"),
]


def test_the_base_config_is_valid() -> None:
    # The control: every value below is refused only for its newline.
    s = Settings(**base())
    assert s.services["kimi"].router_servers["gpu-node-1"] == "node1"
    assert maintenance_path_problem(s, "gpu-node-1") is None


@pytest.mark.parametrize(
    ("path", "reaches"), VALUES, ids=[".".join(map(str, p)) for p, _ in VALUES]
)
def test_a_trailing_newline_is_refused(path: tuple[str | int, ...], reaches: str) -> None:
    data = copy.deepcopy(base())
    node, key = _at(data, path)
    node[key] = node[key] + "\n"
    with pytest.raises(ValidationError) as caught:
        Settings(**data)
    said = str(caught.value)
    # The refusal is the validator's own, naming the value (not some other error).
    named = repr(node[key]) in said or "the first element must be an absolute path" in said
    assert named, (reaches, said)


@pytest.mark.parametrize(
    "path",
    [
        ("hosts", "gpu-node-1"),
        ("services", "kimi"),
        ("routers", "front"),
        ("services", "kimi", "indexes", "internal"),
    ],
    ids=["host", "service", "router", "index"],
)
def test_a_name_with_a_trailing_newline_is_refused(path: tuple[str, ...]) -> None:
    # Names reach the sudoers file (a service's alias, a host's comment) and argv.
    data = copy.deepcopy(base())
    node, key = _at(data, path)
    node[f"{key}\n"] = node.pop(key)
    with pytest.raises(ValidationError) as caught:
        Settings(**data)
    assert "is not a valid name" in str(caught.value)


@pytest.mark.parametrize("key", ["systemctl", "nvidia_smi"])
def test_a_maintenance_tool_with_a_trailing_newline_is_refused(key: str) -> None:
    # Absolute (a sudo host needs that), or a bare name for a host run as root.
    for value in (f"/usr/bin/{key}\n", f"{key}\n"):
        data = copy.deepcopy(base())
        data["maintenance"][key] = value
        with pytest.raises(ValidationError):
            Settings(**data)


def test_the_sudoers_printer_refuses_a_login_with_a_trailing_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The login is written into the drop-in's rules (`<login> ALL = (root) ...`).
    config = tmp_path / "chatops.toml"
    config.write_text(
        '[hosts.gpu]\naddress = "10.0.0.1"\nknown_hosts = "/k"\nbecome = "sudo"\n'
        'user = "vllm-bot"\n[services.kimi]\nhosts = ["gpu"]\nunit = "vllm-kimi.service"\n'
        'python = "/opt/venvs/vllm/bin/python"\nuv = "/usr/bin/uv"\n'
        'systemctl = "/usr/bin/systemctl"\njournalctl = "/usr/bin/journalctl"\n'
    )
    monkeypatch.setenv("CHATOPS_CONFIG", str(config))
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["sudoers", "--user", "vllm-bot\n"])
    assert code != 0
    assert "is not an account name" in err.getvalue()


def test_a_command_routers_server_with_a_trailing_newline_is_refused() -> None:
    # The command kind's server name is the `{server}` word of the operator's
    # drain/undrain/in_flight commands, run on the router's host.
    data = copy.deepcopy(base())
    data["services"]["kimi"]["router"] = "cmd"
    assert Settings(**data).services["kimi"].router == "cmd"  # the control: valid
    data["services"]["kimi"]["router_servers"]["gpu-node-1"] = "node1\n"
    with pytest.raises(ValidationError, match=r"router_servers.gpu-node-1 = 'node1\\n' is not a"):
        Settings(**data)
