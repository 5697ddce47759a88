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
