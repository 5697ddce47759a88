"""bot.core.remote: parsers of what the host's tools print, on captured real output."""

from __future__ import annotations

import pytest

from bot.core.remote import (
    UNIT_PROPERTIES,
    journal_tail,
    parse_df_avail_mib,
    unit_is_active,
    unit_show,
    unit_start,
    unit_stop,
)
from bot.settings import ServiceSettings

HEADER = "Filesystem     1048576-blocks  Used Available Capacity Mounted on\n"


# Every sample below is real `df -P -B1M PATH` output from GNU coreutils 9.1 (the dev
# machine of issue 9), captured after, as root:
#   mount -t tmpfs -o size=64m tmpfs '/tmp/df sample/mnt 1'
#   mount -t tmpfs -o size=32m 'my fs' '/tmp/df sample/m2'
#   mount -t tmpfs -o size=16m tmpfs '/tmp/df sample/m3 12 34 56 7% /x'
@pytest.mark.parametrize(
    ("line", "avail"),
    [
        ("/dev/vda               258020 22348     81551      22% /", 81551),
        # A space in the mount point: the old parser (third field from the end) read
        # "/tmp/df" and preflight refused with "cannot read free disk space" (issue 9).
        ("tmpfs                      64     0        64       0% /tmp/df sample/mnt 1", 64),
        # A space in the filesystem name: splitting from the left is not safe either.
        ("my fs                      32     0        32       0% /tmp/df sample/m2", 32),
        # A mount point that looks like more columns.
        (
            "tmpfs                      16     0        16       0% /tmp/df sample/m3 12 34 56 7% /x",  # noqa: E501 (a real capture, kept whole)
            16,
        ),
    ],
)
def test_df_avail_is_read_whatever_spaces_the_names_hold(line: str, avail: int) -> None:
    assert parse_df_avail_mib(HEADER + line + "\n") == avail


@pytest.mark.parametrize(
    "text",
    [
        "",
        HEADER,
        # What GNU df says of a missing path (on stderr; stdout is then empty).
        "df: /opt/venvs/vllm: No such file or directory\n",
        HEADER + "tmpfs 64 0 n/a 0% /srv\n",
        HEADER + "tmpfs 64 0 64 0% relative\n",
    ],
)
def test_df_output_of_another_shape_is_unknown(text: str) -> None:
    assert parse_df_avail_mib(text) is None


def _service(unit: str) -> ServiceSettings:
    return ServiceSettings(hosts=["h1"], unit=unit, python="/opt/venvs/vllm/bin/python")


def test_systemctl_reads_the_unit_after_the_end_of_options() -> None:
    # "--" ends getopt's options, so even a unit that reached here starting with "-"
    # would be a unit (systemd 252: `systemctl stop -- --now.service` is accepted).
    svc = _service("vllm-kimi-k25")
    assert unit_show(svc) == (
        "systemctl",
        "show",
        "-p",
        UNIT_PROPERTIES,
        "--no-pager",
        "--",
        "vllm-kimi-k25",
    )
    assert unit_is_active(svc) == ("systemctl", "is-active", "--no-pager", "--", "vllm-kimi-k25")
    assert unit_stop(svc) == ("systemctl", "stop", "--no-pager", "--", "vllm-kimi-k25")
    assert unit_start(svc) == ("systemctl", "start", "--no-pager", "--", "vllm-kimi-k25")
    # journalctl takes the unit as the value of -u, whatever it starts with.
    assert journal_tail(svc, 5) == ("journalctl", "-u", "vllm-kimi-k25", "-n", "5", "--no-pager")
