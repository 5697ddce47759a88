"""Simulated ``cat``, for one file only: ``/proc/sys/kernel/random/boot_id`` prints the
simulated host's boot id (a lowercase UUID and a newline, as the kernel's file reads),
which a reboot changes (bot.sim.power). Any other use is the real ``/bin/cat``."""

from __future__ import annotations

import os
import sys

from bot.sim.state import StateStore

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
REAL_CAT = "/bin/cat"


def main(store: StateStore, args: list[str]) -> int:
    if args == [BOOT_ID_PATH]:
        sys.stdout.write(store.read().boot_id + "\n")
        return 0
    sys.stdout.flush()
    os.execv(REAL_CAT, ["cat", *args])  # noqa: S606  # the real cat, as the wrapper runs it
