"""bot.core.health: ``nvidia-smi -q`` and kernel Xid lines, judged per GPU.

The ``nvidia-smi -q`` texts and Xid lines below are WRITTEN TO NVIDIA's documented
formats (the ``nvidia-smi -q`` layout: indented ``Key : value`` lines under section
headers ``ECC Errors`` / ``Volatile`` / ``Aggregate`` / ``DRAM Uncorrectable``,
``Retired Pages`` / ``Pending Page Blacklist``, ``Remapped Rows`` / ``Pending`` /
``Remapping Failure Occurred``; the kernel's ``NVRM: Xid (PCI:0000:3b:00): 79, ...``
line), NOT captured from a GPU: no captured nvidia-smi -q output or driver log is
committed (tests/samples/SOURCES.md: third-party text is not copied). The project's
development machine has no GPU; a capture from a real host should replace them.
"""

from __future__ import annotations

import pytest

from bot.core.flows import EndStep
from bot.core.gpu import Gpu
from bot.core.health import (
    GpuCheck,
    GpuReading,
    Level,
    XidEvent,
    health_note,
    judge,
    kernel_log_unreadable,
    new_xids,
    normal_pci,
    parse_health_query,
    parse_xid_lines,
)
from bot.core.plan import Step
from bot.core.status import HostStatus
from bot.errors import GpuQueryError
from tests import test_sequence as seq

UUID0 = "GPU-6f1c0000-1a2b-3c4d-5e6f-0123456789ab"
UUID1 = "GPU-6f1c0001-1a2b-3c4d-5e6f-0123456789ab"


def section(
    bus: str,
    uuid: str,
    *,
    volatile_dram: str = "0",
    aggregate_dram: str = "0",
    pending_page: str = "No",
    remap_pending: str = "No",
    remap_failure: str = "No",
    recovery: str | None = "None",
) -> str:
    """One GPU's section in the documented layout (current drivers: SRAM/DRAM counters)."""
    lines = [
        f"GPU {bus}",
        "    Product Name                          : NVIDIA H200",
        f"    GPU UUID                              : {uuid}",
    ]
    if recovery is not None:
        lines.append(f"    GPU Recovery Action                   : {recovery}")
    lines += [
        "    PCI",
        "        Bus                               : 0x3B",
        f"        Bus Id                            : {bus}",
        "    ECC Mode",
        "        Current                           : Enabled",
        "        Pending                           : Enabled",
        "    ECC Errors",
        "        Volatile",
        "            SRAM Correctable              : 0",
        "            SRAM Uncorrectable Parity     : 0",
        "            SRAM Uncorrectable SEC-DED    : 0",
        "            DRAM Correctable              : 12",
        f"            DRAM Uncorrectable            : {volatile_dram}",
        "        Aggregate",
        "            SRAM Correctable              : 0",
        "            SRAM Uncorrectable Parity     : 0",
        "            SRAM Uncorrectable SEC-DED    : 0",
        "            DRAM Correctable              : 40",
        f"            DRAM Uncorrectable            : {aggregate_dram}",
        "            SRAM Threshold Exceeded       : No",
        "    Retired Pages",
        "        Single Bit ECC                    : N/A",
        "        Double Bit ECC                    : N/A",
        f"        Pending Page Blacklist            : {pending_page}",
        "    Remapped Rows",
        "        Correctable Error                 : 0",
        "        Uncorrectable Error               : 0",
        f"        Pending                           : {remap_pending}",
        f"        Remapping Failure Occurred        : {remap_failure}",
        "        Bank Remap Availability Histogram",
        "            Max                           : 2560 bank(s)",
        "            High                          : 0 bank(s)",
        "",
    ]
    return "\n".join(lines)


HEADER = (
    "\n==============NVSMI LOG==============\n\n"
    "Timestamp                                 : Mon Nov 30 23:00:00 2026\n"
    "Driver Version                            : 590.44.01\n"
    "CUDA Version                              : 13.1\n\n"
    "Attached GPUs                             : 2\n"
)


def query(*sections: str) -> str:
    return HEADER + "".join(sections)


def gpus() -> tuple[Gpu, ...]:
    return (Gpu(0, UUID0, "NVIDIA H200", 0, 143771, 0), Gpu(1, UUID1, "NVIDIA H200", 0, 143771, 0))


def xid(code: int, text: str, pci: str = "0000:3b:00", stamp: str = "Nov 30 22:01:02") -> str:
    return f"{stamp} gpu-node-1 kernel: NVRM: Xid (PCI:{pci}): {code}, {text}"


# --------------------------------------------------------------------------- parsing


def test_a_healthy_gpu_reads_as_clean() -> None:
    (r,) = parse_health_query("h", query(section("00000000:3B:00.0", UUID0)))
    assert r == GpuReading(UUID0, "0000:3b:00", 0, 0, False, False, False, "None")


def test_each_field_the_verdict_needs_is_read() -> None:
    text = query(
        section(
            "00000000:3B:00.0",
            UUID0,
            volatile_dram="2",
            aggregate_dram="5",
            pending_page="Yes",
            remap_pending="Yes",
            remap_failure="Yes",
            recovery="Reset",
        ),
        section("00000000:5D:00.0", UUID1, recovery=None),
    )
    first, second = parse_health_query("h", text)
    assert (first.volatile_uncorrectable, first.aggregate_uncorrectable) == (2, 5)
    assert (first.retired_pending, first.remap_pending, first.remap_failure) == (True,) * 3
    assert first.recovery_action == "Reset"
    assert (second.uuid, second.pci, second.recovery_action) == (UUID1, "0000:5d:00", None)


def test_older_drivers_double_bit_total_is_read() -> None:
    # Older drivers print Single Bit / Double Bit counters with a Total per kind.
    text = "\n".join(
        [
            "GPU 00000000:3B:00.0",
            f"    GPU UUID                              : {UUID0}",
            "    ECC Errors",
            "        Volatile",
            "            Single Bit",
            "                Device Memory             : 3",
            "                Total                     : 3",
            "            Double Bit",
            "                Device Memory             : 1",
            "                Total                     : 1",
            "        Aggregate",
            "            Double Bit",
            "                Total                     : 4",
            "    Retired Pages",
            "        Pending                           : No",
            "    Remapped Rows                         : N/A",
        ]
    )
    (r,) = parse_health_query("h", text)
    assert (r.volatile_uncorrectable, r.aggregate_uncorrectable) == (1, 4)
    assert r.remap_pending is None and r.remap_failure is None and r.retired_pending is None


def test_not_available_values_stay_unknown() -> None:
    text = query(
        section(
            "00000000:3B:00.0",
            UUID0,
            volatile_dram="N/A",
            aggregate_dram="N/A",
            pending_page="N/A",
            remap_pending="N/A",
            remap_failure="N/A",
            recovery="N/A",
        )
    )
    (r,) = parse_health_query("h", text)
    assert r == GpuReading(UUID0, "0000:3b:00")


def test_a_section_without_uuid_is_an_error() -> None:
    with pytest.raises(GpuQueryError, match="has no GPU UUID"):
        parse_health_query("h", "GPU 00000000:3B:00.0\n    Product Name : NVIDIA H200\n")


def test_no_gpu_section_reads_as_no_reading() -> None:
    assert parse_health_query("h", HEADER.replace(": 2", ": 0")) == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00"),
        ("PCI:0000:3b:00", "0000:3b:00"),
        ("0000:3B:00", "0000:3b:00"),
        ("3b:00", None),
        ("", None),
    ],
)
def test_pci_addresses_normalise_alike(text: str, expected: str | None) -> None:
    assert normal_pci(text) == expected


def test_xid_lines_from_journalctl_and_dmesg() -> None:
    text = "\n".join(
        [
            "-- No entries --",
            xid(79, "pid=1234, name=python3, GPU has fallen off the bus."),
            "[ 7201.123456] NVRM: Xid (PCI:0000:5d:00): 13, Graphics Exception: ESR 0x404490",
            "Nov 30 22:01:03 gpu-node-1 kernel: NVRM: GPU at PCI:0000:3b:00: GPU-abc",
        ]
    )
    first, second = parse_xid_lines(text)
    assert (first.pci, first.code) == ("0000:3b:00", 79)
    assert first.text == "pid=1234, name=python3, GPU has fallen off the bus."
    assert (second.pci, second.code) == ("0000:5d:00", 13)
    assert second.line.startswith("[ 7201.123456]")


def test_new_xids_are_the_lines_added_counting_repeats() -> None:
    a = parse_xid_lines(xid(13, "x") + "\n" + xid(13, "x"))
    b = parse_xid_lines("\n".join([xid(13, "x")] * 3 + [xid(79, "y", stamp="Nov 30 23:00:00")]))
    assert [e.code for e in new_xids(a, b)] == [13, 79]
    assert new_xids(b, b) == ()


@pytest.mark.parametrize(
    ("stdout", "stderr", "status", "readable"),
    [
        ("Nov 30 h kernel: NVRM: Xid ...", "", 0, True),
        ("-- No entries --\n", "", 0, True),
        ("", "", 1, True),  # some versions exit 1 when --grep matched nothing
        (
            "",
            "Hint: You are currently not seeing messages from other users and the system.\n"
            "      Users in groups 'adm', 'systemd-journal' can see all messages.",
            0,
            False,
        ),
        ("", "No journal files were opened due to insufficient permissions.", 1, False),
        ("", "Compiled without pattern matching support", 1, False),
        ("", "Failed to open journal", 1, False),
    ],
)
def test_a_kernel_log_the_user_cannot_read_is_not_read_as_clean(
    stdout: str, stderr: str, status: int, readable: bool
) -> None:
    assert (kernel_log_unreadable(stdout, stderr, status) is None) == readable


# --------------------------------------------------------------------------- the verdict


def readings(**first: object) -> tuple[GpuReading, ...]:
    base = GpuReading(UUID0, "0000:3b:00", 0, 0, False, False, False, "None")
    return (
        GpuReading(**{**{f: getattr(base, f) for f in base.__slots__}, **first}),
        GpuReading(UUID1, "0000:5d:00", 0, 0, False, False, False, "None"),
    )


@pytest.mark.parametrize(
    ("state", "needle"),
    [
        ({"remap_pending": True}, "row remap is pending"),
        ({"remap_failure": True}, "row remap failed"),
        ({"retired_pending": True}, "retired page is pending"),
        ({"volatile_uncorrectable": 2}, "2 uncorrectable ECC error(s) since the last reset"),
        ({"recovery_action": "Reboot"}, "recovery action: Reboot"),
    ],
)
def test_a_state_that_needs_a_reset_is_critical(state: dict[str, object], needle: str) -> None:
    h = judge("h", gpus(), readings(**state), ())
    assert h.gpus[0].level == Level.CRITICAL and h.gpus[1].level == Level.OK
    (problem,) = h.problems(Level.CRITICAL)
    assert problem.startswith("GPU 0: ") and needle in problem
    assert h.level({UUID1}) == Level.OK  # another service's GPU is not this one's


def test_uncorrectable_errors_only_in_the_past_are_a_warning() -> None:
    h = judge("h", gpus(), readings(aggregate_uncorrectable=3), ())
    assert h.level() == Level.WARN
    assert "3 uncorrectable ECC error(s) over the GPU's life" in h.summary()


@pytest.mark.parametrize(
    ("code", "level"),
    [
        (79, Level.CRITICAL),
        (48, Level.CRITICAL),
        (95, Level.CRITICAL),
        (119, Level.CRITICAL),
        (120, Level.CRITICAL),
        (64, Level.CRITICAL),
        (13, Level.WARN),
        (31, Level.WARN),
        (43, Level.WARN),
        (94, Level.WARN),
        (63, Level.WARN),
        (999, Level.WARN),
    ],
)
def test_each_xid_has_its_level_and_action(code: int, level: Level) -> None:
    event = XidEvent("0000:3b:00", code, "text", xid(code, "text"))
    h = judge(
        "h", gpus(), (GpuReading(UUID0, "0000:3b:00"), GpuReading(UUID1, "0000:5d:00")), (event,)
    )
    assert h.gpus[0].level == level
    (finding,) = h.gpus[0].findings
    assert finding.action and f"Xid {code}" in finding.what and "Nov 30 22:01:02" in finding.what


def test_an_xid_whose_cause_the_state_shows_gone_is_a_warning() -> None:
    # Xid 48 is in this boot's log, but the volatile count is 0: the GPU was reset since.
    event = parse_xid_lines(xid(48, "DBE"))
    reset_since = (GpuReading(UUID0, "0000:3b:00", volatile_uncorrectable=0),)
    assert judge("h", gpus(), reset_since, event).gpus[0].level == Level.WARN
    still = (GpuReading(UUID0, "0000:3b:00", volatile_uncorrectable=1),)
    assert judge("h", gpus(), still, event).gpus[0].level == Level.CRITICAL
    unknown = (GpuReading(UUID0, "0000:3b:00"),)
    assert judge("h", gpus(), unknown, event).gpus[0].level == Level.CRITICAL


def test_xid_79_stays_critical_whatever_the_driver_says_now() -> None:
    event = parse_xid_lines(xid(79, "GPU has fallen off the bus."))
    clean = (GpuReading(UUID0, "0000:3b:00", 0, 0, False, False, False, "None"),)
    assert judge("h", gpus(), clean, event).gpus[0].level == Level.CRITICAL


def test_an_xid_at_an_address_no_gpu_answers_is_critical_for_every_service() -> None:
    event = parse_xid_lines(xid(79, "GPU has fallen off the bus.", pci="0000:61:00"))
    h = judge("h", gpus(), readings(), event)
    assert [g.level for g in h.gpus] == [Level.OK, Level.OK]
    assert h.level({UUID1}) == Level.CRITICAL
    assert "PCI 0000:61:00 (no GPU answers there now)" in h.problems(Level.CRITICAL)[0]


def test_a_flood_of_one_xid_is_one_finding_with_a_count() -> None:
    events = parse_xid_lines(
        "\n".join(xid(13, f"n{i}", stamp=f"Nov 30 22:01:{i:02d}") for i in range(50))
    )
    h = judge("h", gpus(), readings(), events)
    (finding,) = h.gpus[0].findings
    assert "Xid 13 x50" in finding.what and "last at Nov 30 22:01:49" in finding.what


def test_a_healthy_host_says_so() -> None:
    assert judge("h", gpus(), readings(), ()).summary() == "2 GPUs healthy"


# --------------------------------------------------------------------------- the card's note


def test_a_healthy_service_has_no_note_for_the_card() -> None:
    check = GpuCheck(None, judge("h", gpus(), readings(), ()), frozenset({UUID0, UUID1}))
    assert check.level == Level.OK and health_note("h", check) is None


def test_the_cards_note_names_each_finding_of_the_services_gpus_only() -> None:
    # GPU 0 is critical but belongs to another service; this one's GPU 1 only warns.
    second = GpuReading(UUID1, "0000:5d:00", 0, 3, False, False, False, "None")
    h = judge("h", gpus(), (readings(remap_pending=True)[0], second), ())
    note = health_note("h", GpuCheck(None, h, frozenset({UUID1})))
    assert note is not None and note.level == Level.WARN
    assert note.text == (
        "h: GPU 1 warn: 3 uncorrectable ECC error(s) over the GPU's life, "
        "none since the last reset (none now; watch for more)"
    )


def test_the_cards_note_says_the_preflight_will_refuse_a_critical_gpu() -> None:
    h = judge("h", gpus(), readings(remap_pending=True), ())
    note = health_note("h", GpuCheck("not fit to run on: ...", h, None, "all GPUs"))
    assert note is not None and note.level == Level.CRITICAL
    assert note.text.startswith(
        "h: GPU 0 critical: a row remap is pending (reset the GPU "
        "(nvidia-smi -r) while it is idle to apply it). The preflight "
        "will refuse the run on h before anything changes"
    )
    # Fewer GPUs than the service needs refuses too, whatever their health.
    why = "the service needs GPUs 0, 5, but h lists 2 GPUs (0, 1): GPU 5 missing"
    missing = GpuCheck(why, judge("h", gpus(), readings(), ()), None, "GPUs 0, 5", why)
    note = health_note("h", missing)
    assert note is not None and note.level == Level.CRITICAL
    assert note.text.startswith(f"h: {why}. The preflight will refuse the run on h")


def test_a_host_that_cannot_be_read_is_unknown_never_ok() -> None:
    lost = health_note("h", GpuCheck("cannot reach h to check its GPUs (timed out)"))
    failed = health_note("h", None, "connection refused")
    assert lost is not None and lost.level is None
    assert lost.text.startswith("h: unknown (cannot reach h to check its GPUs (timed out))")
    assert failed is not None and failed.level is None
    assert failed.text.startswith("h: unknown (connection refused); the preflight reads it")


@pytest.mark.parametrize("state", [{"remap_pending": "Yes"}, {"volatile_dram": "2"}, {}])
def test_the_verdict_is_the_same_whichever_source_read_the_state(state: dict[str, str]) -> None:
    """A run's GPU check judges NVML's readings (the bot's own host) exactly as the same
    state read by nvidia-smi -q; only the step's output says which it was."""
    text = section("00000000:61:00.0", seq.UUIDS[3], **state)
    smi, nvml = seq.Host(health_q=text), seq.Host(nvml=parse_health_query("h1", text))
    by_smi, by_nvml = seq.run(smi, "restart"), seq.run(nvml, "restart")
    assert by_smi == by_nvml
    assert by_smi.status == (HostStatus.SUCCEEDED if not state else HostStatus.ABORTED)

    def check(host: seq.Host) -> EndStep:
        return next(n for n in host.notices if isinstance(n, EndStep) and n.step == Step.GPU_CHECK)

    assert check(smi).summary == check(nvml).summary
    said_smi, _, rest_smi = check(smi).detail.partition("\n")
    said_nvml, _, rest_nvml = check(nvml).detail.partition("\n")
    assert (said_smi, said_nvml) == ("GPU health from nvidia-smi -q", "GPU health from NVML")
    assert rest_smi == rest_nvml
    assert ("nvidia-smi", "-q") in smi.calls and ("nvidia-smi", "-q") not in nvml.calls


# --------------------------------------------------------------------------- issue 17

# The GPU Reset Status section as public nvidia-smi -q captures print it; each sample
# below rebuilds one capture's shape (section order, padding, values) with our own
# UUIDs and bus ids (tests/samples/SOURCES.md, "GPU health and the GPU query"):
# - 560.35.03 on an H100 (jdh4/job_data_2023, README.md, `nvidia-smi -a` on della):
#   "GPU Reset Status" / "Reset Required : No" / "Drain and Reset Recommended : No"
#   between "GPU Virtualization Mode" and "GSP Firmware Version", no recovery action;
# - 535.247.01 on an RTX 3090 stuck after a fault (a public server hand-over note found
#   with find_string "Reset Required : Yes"): "Reset Required : Yes" with "Drain and
#   Reset Recommended : No", the clocks and fans "System is not in ready state";
# - 530.30.02 on a T4: "Drain and Reset Recommended : N/A";
# - R570+ (a public nvidia-smi -q of a V100 host): both keys "Requested functionality
#   has been deprecated", then "GPU Recovery Action : None".


def reset_section(
    bus: str,
    uuid: str,
    reset: str,
    drain: str,
    *,
    recovery: str | None = None,
    not_ready: bool = False,
) -> str:
    lines = [
        f"GPU {bus}",
        "    Product Name                          : NVIDIA H100 80GB HBM3",
        f"    GPU UUID                              : {uuid}",
        "    GPU Virtualization Mode",
        "        Virtualization Mode               : None",
        "        Host VGPU Mode                    : N/A",
        "    GPU Reset Status",
        f"        Reset Required                    : {reset}",
        f"        Drain and Reset Recommended       : {drain}",
    ]
    if recovery is not None:
        lines.append(f"    GPU Recovery Action                   : {recovery}")
    lines += [
        "    GSP Firmware Version                  : 560.35.03",
        "    PCI",
        "        Bus                               : 0x3B",
        f"        Bus Id                            : {bus}",
    ]
    if not_ready:
        lines += [
            "    Fan Speed                             : System is not in ready state",
            "    Performance State                     : P0",
            "    Power Draw                            : Unknown Error",
        ]
    return "\n".join([*lines, ""])


@pytest.mark.parametrize(
    ("reset", "drain", "recovery"),
    [
        ("No", "No", None),  # drivers 535-560 on a healthy GPU
        ("No", "N/A", None),  # a GPU that does not offer drain-and-reset (530.30.02, T4)
        (
            "Requested functionality has been deprecated",
            "Requested functionality has been deprecated",
            "None",
        ),  # R570+
    ],
)
def test_a_gpu_whose_reset_status_says_no_or_is_not_offered_passes(
    reset: str, drain: str, recovery: str | None
) -> None:
    (r,) = parse_health_query(
        "h", query(reset_section("00000000:3B:00.0", UUID0, reset, drain, recovery=recovery))
    )
    assert r.reset_required is (False if reset == "No" else None)
    assert r.drain_and_reset is (False if drain == "No" else None) and r.reset_unknown is None
    h = judge("h", gpus()[:1], (r,), ())
    assert h.level() == Level.OK and h.summary() == "1 GPU healthy"


def test_a_gpu_the_driver_says_needs_a_reset_is_critical() -> None:
    # The 535.247.01 capture: Reset Required: Yes, drain No, the GPU "not in ready state".
    text = query(
        reset_section("00000000:3B:00.0", UUID0, "Yes", "No", not_ready=True),
        reset_section("00000000:5D:00.0", UUID1, "No", "No"),
    )
    sick, well = parse_health_query("h", text)
    assert (sick.reset_required, sick.drain_and_reset) == (True, False)
    assert (well.reset_required, well.drain_and_reset) == (False, False)
    h = judge("h", gpus(), (sick, well), ())
    assert [g.level for g in h.gpus] == [Level.CRITICAL, Level.OK]
    (problem,) = h.problems(Level.CRITICAL)
    assert problem == (
        "GPU 0: the driver says the GPU needs a reset (GPU Reset Status: Reset "
        "Required: Yes) (reset the GPU (nvidia-smi -r) once no process uses "
        "it, or reboot the node)"
    )


def test_drain_and_reset_recommended_asks_for_the_drain_first() -> None:
    (r,) = parse_health_query("h", query(reset_section("00000000:3B:00.0", UUID0, "Yes", "Yes")))
    h = judge("h", gpus()[:1], (r,), ())
    (finding,) = h.gpus[0].findings
    assert finding.level == Level.CRITICAL
    assert finding.what == (
        "the driver recommends a drain and reset (GPU Reset Status: Reset "
        "Required: Yes, Drain and Reset Recommended: Yes)"
    )
    assert (
        finding.action.startswith("drain it: stop every job on this GPU")
        and "then reset it" in finding.action
    )


def test_a_reset_status_this_bot_cannot_read_is_not_taken_as_no() -> None:
    (r,) = parse_health_query(
        "h", query(reset_section("00000000:3B:00.0", UUID0, "Unknown Error", "No"))
    )
    assert r.reset_required is None and r.reset_unknown == "Reset Required: Unknown Error"
    h = judge("h", gpus()[:1], (r,), ())
    assert h.level() == Level.WARN
    assert "GPU Reset Status cannot be read (Reset Required: Unknown Error)" in h.summary()


def test_an_xid_is_not_cleared_while_the_driver_still_wants_a_reset() -> None:
    # Recovery action None would say an Xid 119's cause is gone; Reset Required says not.
    event = parse_xid_lines(xid(119, "Timeout after 6s of waiting for RPC response"))
    stuck = (GpuReading(UUID0, "0000:3b:00", recovery_action="None", reset_required=True),)
    xid119 = [f for f in judge("h", gpus(), stuck, event).gpus[0].findings if "Xid" in f.what]
    assert [f.level for f in xid119] == [Level.CRITICAL]
    clear = (GpuReading(UUID0, "0000:3b:00", recovery_action="None", reset_required=False),)
    assert judge("h", gpus(), clear, event).gpus[0].level == Level.WARN


def test_a_reset_required_gpu_refuses_the_run_before_the_stop() -> None:
    text = reset_section("00000000:61:00.0", seq.UUIDS[3], "Yes", "Yes")
    host = seq.Host(health_q=text)
    outcome = seq.run(host, "restart")
    assert outcome.status == HostStatus.ABORTED
    assert "GPU 3: the driver recommends a drain and reset" in outcome.summary
    assert not any(c[:2] == ("systemctl", "stop") for c in host.calls)
    assert seq.steps(host)[-1] == ("gpu_check", False)


# Section and key names whatever their case: the capture has "Retired pages"
# where current drivers print "Retired Pages" (no public capture with the lower-case
# spelling was found to rebuild; these are the current names in other cases).
def test_section_and_key_names_match_whatever_their_case() -> None:
    text = section(
        "00000000:3B:00.0", UUID0, pending_page="Yes", remap_pending="Yes", volatile_dram="2"
    )
    for name in (
        "Retired Pages",
        "Remapped Rows",
        "ECC Errors",
        "Pending Page Blacklist",
        "DRAM Uncorrectable",
        "GPU UUID",
        "Bus Id",
    ):
        text = text.replace(name, name[:1] + name[1:].lower())
    text += (
        reset_section("00000000:5D:00.0", UUID1, "Yes", "No")
        .replace("GPU Reset Status", "GPU reset status")
        .replace("Reset Required", "Reset required")
    )
    first, second = parse_health_query("h", text)
    assert "Retired pages" in text and "Remapped rows" in text
    assert (first.retired_pending, first.remap_pending, first.volatile_uncorrectable) == (
        True,
        True,
        2,
    )
    assert first.pci == "0000:3b:00" and second.reset_required is True


# --------------------------------------------------------------------------- MIG Xid lines

# The MIG form is krcReportXid's (NVIDIA/open-gpu-kernel-modules,
# src/nvidia/src/kernel/gpu/rc/kernel_rc.c: "PCI:%04x:%02x:%02x GPU-I:%02u" and
# "... GPU-I:%02u GPU-CI:%02u"); the Xid 94 text is the shape of the example in
# _gpuGenerateErrorLog_GA100's comment (src/nvidia/src/kernel/gpu/arch/ampere/
# kern_gpu_ga100.c, "Contained: CE User Channel (0x9). RST: No, D-RST: No"). The old form
# without "PCI:" is the shape of a forum post's syslog ("kernel: [176830.774761] NVRM: Xid
# (0000:03:00): 13, 0003 00000000 ...", found with find_string "NVRM: Xid (0000:"; public
# Go and Rust Xid parsers' test tables quote the same form).
MIG_LINES = "\n".join(
    [
        "Nov 30 22:10:01 gpu-node-1 kernel: NVRM: Xid (PCI:0000:5d:00 GPU-I:05): 94, pid=61502, "
        "name=python3, Contained: SM (0x1). RST: No, D-RST: No",
        "Nov 30 22:10:02 gpu-node-1 kernel: NVRM: Xid (PCI:0000:5d:00 GPU-I:03 GPU-CI:01): 94, "
        "pid=61544, Contained: CE User Channel (0x9). RST: No, D-RST: No",
        "[ 8123.402114] NVRM: Xid (0000:3b:00): 13, 0004 00000000 0000a1c0 00001a0c 00000000 00000040",  # noqa: E501 (a real capture, kept whole)
    ]
)


def test_mig_and_old_form_xid_lines_are_read() -> None:
    first, second, third = parse_xid_lines(MIG_LINES)
    assert (first.pci, first.code, first.instance) == ("0000:5d:00", 94, "GPU-I:05")
    assert first.text == "pid=61502, name=python3, Contained: SM (0x1). RST: No, D-RST: No"
    assert (second.pci, second.code, second.instance) == ("0000:5d:00", 94, "GPU-I:03 GPU-CI:01")
    assert (third.pci, third.code, third.instance) == ("0000:3b:00", 13, "")
    assert third.line.startswith("[ 8123.402114]")


def test_a_mig_xid_is_the_gpu_at_its_address_with_the_instance_named() -> None:
    h = judge("h", gpus(), readings(), parse_xid_lines(MIG_LINES))
    (mig,) = h.gpus[1].findings
    assert mig.level == Level.WARN
    assert mig.what == (
        "Xid 94 x2 (contained ECC error) on MIG instance GPU-I:03 GPU-CI:01, "
        "GPU-I:05, last at Nov 30 22:10:02"
    )
    (old,) = h.gpus[0].findings
    assert old.what.startswith("Xid 13 (graphics engine exception)") and h.host_findings == ()
