"""bot.settings: what the configuration refuses, and how the refusal names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.errors import ConfigError
from bot.settings import load_settings

CONFIG = """
[hosts.gpu1]
address = "10.0.0.1"
known_hosts = "/tmp/known_hosts"

[services.kimi]
hosts = ["gpu1"]
unit = "{unit}"
python = "/opt/venvs/vllm/bin/python"
"""


# systemd 252 reads `systemctl stop --now.service` as "unrecognized option '--now.service'"
# and `systemctl show -p LoadState -foo.service` as "Unknown output 'o.service'" (both
# run on the dev machine of issue 9): a unit name that starts with "-" is an option.
@pytest.mark.parametrize("unit", ["-foo.service", "--now.service", "-"])
def test_a_unit_name_that_starts_with_a_dash_is_refused(tmp_path: Path, unit: str) -> None:
    path = tmp_path / "chatops.toml"
    path.write_text(CONFIG.format(unit=unit))
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert f"services.kimi.unit: unit {unit!r} starts with '-'" in str(caught.value)


def test_an_ordinary_unit_name_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "chatops.toml"
    path.write_text(CONFIG.format(unit="vllm-kimi-k25.service"))
    assert load_settings(path).services["kimi"].unit == "vllm-kimi-k25.service"


def test_a_watch_window_shorter_than_its_interval_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "chatops.toml"
    path.write_text(CONFIG.format(unit="vllm-kimi.service") + "watch_s = 20\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)  # watch_interval_s defaults to 30
    assert "watch_interval_s (30) is longer than watch_s (20)" in str(caught.value)
    path.write_text(
        CONFIG.format(unit="vllm-kimi.service") + "watch_s = 20\nwatch_interval_s = 5\n"
    )
    assert load_settings(path).services["kimi"].watch_interval_s == 5


@pytest.mark.parametrize(
    "line",
    [
        'db_path = "postgresql://chatops:hunter2@db/chatops"',
        'CHATOPS_DB = "/srv/other.db"',
        'slack_bot_token = "xoxb-123"',
        'SLACK_SIGNING_SECRET = "abc"',
    ],
)
def test_a_secret_or_a_deployment_value_in_the_file_is_refused_naming_it(
    tmp_path: Path, line: str
) -> None:
    """Issue 21: the database's URL (which may carry its password) and Slack's tokens are
    read from the environment only; a config file that sets one is refused, not obeyed."""
    config = tmp_path / "chatops.toml"
    config.write_text(line + "\n")
    key = line.split(" ")[0]
    with pytest.raises(ConfigError, match=f"{key} is read from the environment only"):
        load_settings(config)
    # The same value from the environment (an override, as --db passes it) is fine.
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    assert load_settings(empty, CHATOPS_DB="x.db").db_path == Path("x.db")
