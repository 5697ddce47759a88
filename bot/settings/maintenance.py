"""``[maintenance]``: how the bot reboots a host or resets its GPUs (issue 23).

::

    [maintenance]
    systemctl = "/usr/bin/systemctl"    # what `systemctl reboot` runs (a sudo rule names it)
    nvidia_smi = "/usr/bin/nvidia-smi"  # what `-pm 0|1 -i N` and `-r -i N` run
    reboot_timeout_s = 900              # an 8-GPU server's POST and boot can take 10 min
    reboot_poll_s = 5
    fabric_wait_s = 120                 # NVSwitch systems: how long to wait for Fabric Manager
    on_failed_check = "stop"            # or "restore"

``fabric_wait_s``: on an NVSwitch system each GPU registers with the NVLink fabric after
a boot or a reset ("Not Started", "In Progress", then "Completed"). The deep check after
the maintenance reads the state again every ``reboot_poll_s`` while a GPU is still
registering, for at most this long, then fails a GPU still not registered: Fabric Manager
is not running (or not the driver's version), and CUDA would fail with error 802.

``on_failed_check``: a host whose deep GPU check fails after its reboot or reset
keeps its services stopped (``stop``, the default: nothing serves on a GPU that needs
attention) or starts the ones that ran before, still out of its router's rotation
(``restore``: a team whose single host is its only capacity would rather serve).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from bot.settings.base import Section

OnFailedCheck = Literal["stop", "restore"]


class MaintenanceSettings(Section):
    systemctl: str = "systemctl"
    nvidia_smi: str = "nvidia-smi"
    reboot_timeout_s: float = Field(900.0, gt=0)
    reboot_poll_s: float = Field(5.0, gt=0)
    # How long a GPU reset (``nvidia-smi -r``) may take before it counts as hung.
    reset_timeout_s: float = Field(120.0, gt=0)
    # How long the deep check waits for a GPU's NVSwitch fabric to finish registering.
    fabric_wait_s: float = Field(120.0, ge=0)
    on_failed_check: OnFailedCheck = "stop"

    @field_validator("systemctl", "nvidia_smi")
    @classmethod
    def _tool(cls, v: str) -> str:
        # These run as root through sudo: an option-looking or relative path with a
        # slash would be a different program than the rule names, and whitespace (a
        # trailing newline) is no part of a command's name.
        if (
            not v
            or v.startswith("-")
            or ("/" in v and not v.startswith("/"))
            or any(c.isspace() for c in v)
        ):
            raise ValueError(f"{v!r} must be a command name or an absolute path")
        return v
