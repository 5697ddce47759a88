"""The deep GPU check's parsers and verdict on real captured output (tests/samples/deep,
sources in tests/samples/SOURCES.md): a bad GPU is flagged and a good one is not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.core.dcgm import DiagResult, DiagTest, parse_diag
from bot.core.deep_check import (
    RESEAT,
    Check,
    DeepFinding,
    DeepReport,
    judge_count,
    judge_dcgm,
    judge_driver,
    judge_gpus,
    judge_nvlink,
)
from bot.core.deep_query import (
    DCGMI_DIAG_ARGV,
    DEEP_QUERY_ARGV,
    MISMATCH_EXIT,
    NVLINK_ARGV,
    DeepReading,
    NvLinks,
    mismatch_of,
    parse_deep_query,
    parse_nvlink,
)
from bot.core.deep_reads import DeepRead, deep_reads, deep_report
from bot.core.health_types import Level
from bot.core.results import CommandResult
from bot.engine.deep_check import deep_summary, deep_text
from bot.errors import GpuQueryError

SAMPLES = Path(__file__).parent / "samples" / "deep"
L4 = (SAMPLES / "nvidia_smi_qx_l4_555.xml").read_text()


def _levels(findings: list[DeepFinding], check: Check) -> list[Level]:
    return [f.level for f in findings if f.check == check]


def test_the_real_l4_capture_reads_and_a_healthy_idle_gpu_is_not_flagged() -> None:
    q = parse_deep_query("h", L4)
    assert q.driver_version == "555.42.06" and q.attached == 1
    (r,) = q.gpus
    assert (r.pcie_gen, r.pcie_gen_max, r.pcie_width, r.pcie_width_max) == (4, 4, 16, 16)
    assert r.throttle == () and r.gpu_idle is True
    assert r.persistence is False and r.fabric_state is None
    found = judge_gpus(q.gpus)
    assert _levels(found, Check.PCIE) == [Level.OK, Level.OK]
    assert _levels(found, Check.THROTTLE) == [Level.OK]
    assert _levels(found, Check.FABRIC) == []  # no NVSwitch: not checked, not "ok"
    # The capture's GPU runs without persistence mode: NVIDIA's advice, a warning.
    (pm,) = [f for f in found if f.check == Check.PERSISTENCE]
    assert pm.level == Level.WARN and "nvidia-persistenced" in pm.action


def _gen(text: str, gen: str) -> str:
    return text.replace(
        "<current_link_gen>4</current_link_gen>", f"<current_link_gen>{gen}</current_link_gen>"
    )


def test_gen1_while_idle_is_power_saving_not_a_finding() -> None:
    # Real GPUs drop their link to gen1 with no work (nvtop issue #6): the sample, idle.
    (r,) = parse_deep_query("h", _gen(L4, "1")).gpus
    pcie = [f for f in judge_gpus([r]) if f.check == Check.PCIE]
    assert [f.level for f in pcie] == [Level.OK, Level.OK]
    assert "while idle" in pcie[1].what


def test_gen1_under_load_is_a_warning() -> None:
    busy = _gen(L4, "1").replace(
        "<clocks_event_reason_gpu_idle>Active", "<clocks_event_reason_gpu_idle>Not Active"
    )
    (r,) = parse_deep_query("h", busy).gpus
    assert r.gpu_idle is False
    assert _levels(judge_gpus([r]), Check.PCIE) == [Level.OK, Level.WARN]


def test_a_link_at_x8_of_x16_fails_even_when_idle() -> None:
    narrow = L4.replace(
        "<current_link_width>16x</current_link_width>",
        "<current_link_width>8x</current_link_width>",
    )
    (r,) = parse_deep_query("h", narrow).gpus
    (bad,) = [f for f in judge_gpus([r], {r.uuid: "GPU 3"}) if f.level == Level.CRITICAL]
    assert bad.what == "PCIe link x8 of x16" and bad.gpu == "GPU 3" and "reseat" in bad.action


@pytest.mark.parametrize(
    ("reason", "level"),
    [
        ("hw_slowdown", Level.CRITICAL),
        ("hw_thermal_slowdown", Level.CRITICAL),
        ("hw_power_brake_slowdown", Level.CRITICAL),
        ("sw_thermal_slowdown", Level.WARN),
    ],
)
def test_hardware_and_thermal_throttle_reasons_are_findings(reason: str, level: Level) -> None:
    tag = f"clocks_event_reason_{reason}"
    (r,) = parse_deep_query("h", L4.replace(f"<{tag}>Not Active", f"<{tag}>Active")).gpus
    assert _levels(judge_gpus([r]), Check.THROTTLE) == [level]


@pytest.mark.parametrize("reason", ["sw_power_cap", "applications_clocks_setting", "sync_boost"])
def test_idle_and_setting_reasons_are_not_findings(reason: str) -> None:
    tag = f"clocks_event_reason_{reason}"
    (r,) = parse_deep_query("h", L4.replace(f"<{tag}>Not Active", f"<{tag}>Active")).gpus
    assert _levels(judge_gpus([r]), Check.THROTTLE) == [Level.OK]


def test_drivers_before_535_name_them_throttle_reasons() -> None:
    # netdata issue #2922's capture: <clocks_throttle_reasons>/<clocks_throttle_reason_*>.
    old = L4.replace("clocks_event_reason", "clocks_throttle_reason").replace(
        "<clocks_throttle_reason_hw_slowdown>Not Active",
        "<clocks_throttle_reason_hw_slowdown>Active",
    )
    (r,) = parse_deep_query("h", old).gpus
    assert r.throttle == ("hw_slowdown",) and r.gpu_idle is True


# The fabric state's verdicts, on the real captures: tests/test_deep_fabric.py.


def test_output_that_is_not_the_xml_is_a_query_error() -> None:
    with pytest.raises(GpuQueryError):
        parse_deep_query("h", "No devices were found")


def test_the_driver_library_mismatch_is_read_from_nvidia_smi() -> None:
    said = (SAMPLES / "nvidia_smi_mismatch_550.txt").read_text()
    m = mismatch_of(MISMATCH_EXIT, said, "")
    assert m is not None and m.library == "550.144"
    f = judge_driver(m)
    assert f.level == Level.CRITICAL and "reboot" in f.action
    assert mismatch_of(0, L4, "") is None and judge_driver(None).level == Level.OK


def test_dcgm3_failed_persistence_test_is_critical_with_its_message() -> None:
    report = parse_diag((SAMPLES / "dcgmi_diag_r1_persistence_fail.txt").read_text())
    assert report.ran and len(report.tests) == 9
    (failed,) = report.failed()
    assert failed.name == "Persistence Mode" and failed.result == DiagResult.FAIL
    assert failed.detail.startswith("Persistence mode for GPU 0 is currently disabled.")
    (f,) = judge_dcgm(report, None)
    assert f.level == Level.CRITICAL and "Deployment/Persistence Mode" in f.what


def test_dcgm4_passing_diag_is_ok() -> None:
    report = parse_diag((SAMPLES / "dcgmi_diag_dcgm4_pass.txt").read_text())
    assert [t.name for t in report.tests] == ["software", "memory", "pcie"]
    assert [f.level for f in judge_dcgm(report, None)] == [Level.OK]


# dcgmi diag -r 3 of 4 x A10G, DCGM 3.3.9: Targeted Power passed on GPUs 0, 2 and 3 and
# failed on GPU 1, the failure on a row with an empty name (SOURCES.md).
POWER = (SAMPLES / "dcgmi_diag_r3_targeted_power_fail_continuation.txt").read_text()
POWER_FAIL_ROW = "|                           | Fail - GPU: 1                                  |"


def _power(report_text: str) -> DiagTest:
    (power,) = (t for t in parse_diag(report_text).tests if t.name == "Targeted Power")
    return power


def test_dcgm3_continuation_row_lowers_the_test_to_the_failure_it_shows() -> None:
    report = parse_diag(POWER)
    assert report.ran and len(report.tests) == 16
    (failed,) = report.failed()
    assert failed.name == "Targeted Power" and failed.section == "Stress"
    # The Warning's wrapped text is the detail; the Info rows' (power readings) are not.
    assert failed.detail.startswith("GPU 1 Max power of 224.1 did not reach desired power")
    assert failed.detail.endswith("GPU utilization are high.") and "usage" not in failed.detail
    (f,) = judge_dcgm(report, None)
    assert f.level == Level.CRITICAL and "Stress/Targeted Power: fail" in f.what


# DCGM prints a test's results in the order Pass, Fail, Warn, Skip, the first on the
# test's row and the others on rows with an empty name, in these words (dcgmi/Diag.cpp,
# HelperDisplayGpuResults, DCGM 3.3.9): the real table with its Fail row changed.
@pytest.mark.parametrize(
    ("row", "result", "level"),
    [
        ("Warn - GPU: 1   ", DiagResult.WARN, Level.WARN),
        ("Skip - GPU: 1   ", DiagResult.SKIP, Level.OK),
        ("Skip - GPUs: 1, 2   ", DiagResult.SKIP, Level.OK),
        ("Aborted - GPU: 1", DiagResult.UNKNOWN, Level.WARN),
    ],
)
def test_dcgm3_warn_skip_and_unknown_continuation_rows(
    row: str, result: DiagResult, level: Level
) -> None:
    text = POWER.replace(POWER_FAIL_ROW, f"|                           | {row:<47}|")
    assert text != POWER
    assert _power(text).result == result
    (f,) = judge_dcgm(parse_diag(text), None)
    assert f.level == level
    if level == Level.OK:  # a skip is DCGM's own verdict: no finding, but said
        assert f.what.endswith("2 skipped (Stress/Targeted Power, Stress/EUD Test)")
    else:
        assert f"Stress/Targeted Power: {result}" in f.what


def test_dcgm3_an_unknown_row_before_a_skip_row_is_not_a_skip() -> None:
    """A result in words DCGM 3.3.9 does not print (a later release's), then DCGM's own
    `Skip` row: the unknown one must still warn. Ranked the other way, the skip would
    hide it and the test would read as DCGM's own skip, an ok."""
    rows = (
        f"|                           | {'Aborted - GPU: 1':<47}|\n"
        f"|                           | {'Skip - GPU: 2':<47}|"
    )
    text = POWER.replace(POWER_FAIL_ROW, rows)
    assert text != POWER
    assert _power(text).result == DiagResult.UNKNOWN
    (f,) = judge_dcgm(parse_diag(text), None)
    assert f.level == Level.WARN and "Stress/Targeted Power: unknown" in f.what


def test_dcgm3_a_test_row_in_unknown_words_is_not_a_pass() -> None:
    row = "| Targeted Power            | Pass - GPUs: 0, 2, 3                           |"
    text = POWER.replace(row, row.replace("Pass - GPUs: 0, 2, 3", "Incomplete          "))
    text = text.replace(POWER_FAIL_ROW + "\n", "")
    assert _power(text).result == DiagResult.UNKNOWN
    (f,) = judge_dcgm(parse_diag(text), None)
    assert f.level == Level.WARN and "Stress/Targeted Power: unknown" in f.what


def test_dcgm_all_pass_with_a_skipped_eud_and_info_rows_is_ok() -> None:
    """The good but unusual table: every GPU passed, the EUD skipped, Info rows printed."""
    text = POWER.replace(POWER_FAIL_ROW + "\n", "").replace(
        "Pass - GPUs: 0, 2, 3", "Pass - All          "
    )
    warning_rows = POWER.split("| Warning")[1].split("| Info")[0]
    text = text.replace("| Warning" + warning_rows, "")
    assert "Warning" not in text and "| Info" in text
    (ok,) = judge_dcgm(parse_diag(text), None)
    assert (
        ok.level == Level.OK
        and ok.what == "dcgmi diag -r 1: 15 passed, 1 skipped (Stress/EUD Test)"
    )


def test_dcgm_a_note_under_a_warned_test_keeps_it_warned() -> None:
    """DCGM prints the Diagnostic's return code on a row with an empty name after "Warn -
    All" (dcgmi/Diag.cpp): neither a pass nor worse than the warning."""
    row = "| Diagnostic                | Pass - All                                     |"
    code = "|                           |   Code: (000000000000)                         |"
    text = POWER.replace(row, row.replace("Pass - All", "Warn - All") + "\n" + code)
    (diagnostic,) = (t for t in parse_diag(text).tests if t.name == "Diagnostic")
    assert diagnostic.result == DiagResult.WARN


def test_dcgm4_a_gpu_row_lowers_its_test() -> None:
    """DCGM 4's per-GPU rows count too: the real table with one GPU row changed."""
    text = (SAMPLES / "dcgmi_diag_dcgm4_pass.txt").read_text()
    memory = text.split("| memory")[1]
    failed = memory.replace("GPU0: Pass", "GPU0: Fail", 1)
    report = parse_diag(text.replace(memory, failed))
    assert [t.result for t in report.tests] == [DiagResult.PASS, DiagResult.FAIL, DiagResult.PASS]


def test_no_dcgmi_is_skipped_and_said_and_a_broken_one_warns() -> None:
    (skipped,) = judge_dcgm(None, None)
    assert skipped.level == Level.OK and "skipped" in skipped.what
    (broken,) = judge_dcgm(parse_diag("Error: unable to connect to host engine"), "exit 255")
    assert broken.level == Level.WARN and "did not run" in broken.what


@pytest.mark.parametrize(
    ("now", "last", "level"),
    [(8, None, Level.OK), (8, 8, Level.OK), (7, 8, Level.CRITICAL), (9, 8, Level.WARN)],
)
def test_gpu_count_against_the_last_known(now: int, last: int | None, level: Level) -> None:
    assert judge_count(now, last).level == level


def test_the_short_answer_keeps_each_verdict_and_what_needs_a_look_failing_hosts_first() -> None:
    ok = DeepFinding(Check.PCIE, Level.OK, "PCIe width x16", gpu="GPU 0")
    bad = DeepFinding(Check.PCIE, Level.CRITICAL, "PCIe link x8 of x16", RESEAT, "GPU 3")
    slow = DeepFinding(Check.THROTTLE, Level.WARN, "clocks held back: thermal", "cool", "GPU 1")
    reports = [
        DeepReport("a", (ok, ok)),
        DeepReport("b", (slow, ok)),
        DeepReport("c", (ok, bad)),
    ]
    assert deep_summary(reports).splitlines() == [
        "c: deep GPU check FAIL (1 of 2 checks ok)",
        f"  FAIL pcie        GPU 3: PCIe link x8 of x16 -> {RESEAT}",
        "b: deep GPU check warn (1 of 2 checks ok)",
        "  warn throttle    GPU 1: clocks held back: thermal -> cool",
        "a: deep GPU check ok (2 of 2 checks ok)",
    ]
    # The full text keeps every line, in the order asked.
    assert deep_text(reports).count("PCIe width x16") == 4


# Real `nvidia-smi nvlink -s` captures (tests/samples/SOURCES.md), UUIDs our own:
# https://github.com/Azure/azhpc-diagnostics/issues/73 (a V100 with links 3 and 5 down)
V100_NVLINK = (SAMPLES / "nvidia_smi_nvlink_s_v100_inactive.txt").read_text()
# https://github.com/leptonai/gpud/issues/1085 (a B200 whose links are all down)
B200_NVLINK = (SAMPLES / "nvidia_smi_nvlink_s_b200_all_inactive.txt").read_text()


def test_nvlink_status_of_real_captures() -> None:
    (v100,) = parse_nvlink(V100_NVLINK)
    assert (v100.index, v100.uuid) == (3, "GPU-3c1f0a52-7e4b-4d0e-9a61-2b8d5f7c0e93")
    assert v100.links == NvLinks(up=(0, 1, 2, 4), down=(3, 5))
    (b200,) = parse_nvlink(B200_NVLINK)
    assert b200.index == 2 and b200.links == NvLinks(all_down=True)
    # As GitHub shows it (spaces for the tab), and a PCIe card's empty answer.
    assert parse_nvlink(V100_NVLINK.replace("\t", "        "))[0].links == v100.links
    assert parse_nvlink("") == ()


def _r(uuid: str, links: NvLinks | None) -> DeepReading:
    return DeepReading(uuid=uuid, pci="?", nvlink=links)


def test_a_link_down_beside_active_ones_fails_with_nvidias_action() -> None:
    (v100,) = parse_nvlink(V100_NVLINK)
    found = judge_nvlink([_r("a", NvLinks(up=tuple(range(6)))), _r("b", v100.links)])
    assert [f.level for f in found] == [Level.OK, Level.CRITICAL]
    assert found[1].what == "NVLink link(s) 3, 5 inactive, 4 active"
    assert "Fabric Manager" in found[1].action and "dcgmi diag -r 2" in found[1].action
    assert found[1].gpu == "GPU 1"


def test_a_gpu_with_every_link_down_fails_where_its_peers_are_up() -> None:
    (b200,) = parse_nvlink(B200_NVLINK)
    up = NvLinks(up=tuple(range(18)))
    found = judge_nvlink([_r("a", up), _r("b", b200.links)], labels={"b": "GPU 2"})
    assert [(f.level, f.gpu) for f in found] == [(Level.OK, "GPU 0"), (Level.CRITICAL, "GPU 2")]
    # No GPU with a link up (NVLink cards without a bridge): said, not failed.
    alone = judge_nvlink([_r("b", b200.links)])
    assert [f.level for f in alone] == [Level.OK] and "no link active" in alone[0].what


def test_no_nvlink_or_no_answer_is_a_skip_and_said() -> None:
    (none,) = judge_nvlink([_r("a", None), _r("b", None)])
    assert none.level == Level.OK and "no NVLink" in none.what and "skipped" in none.what
    (err,) = judge_nvlink([_r("a", None)], "nvidia-smi nvlink -s: exit 3")
    assert err.level == Level.OK and "exit 3" in err.what and "skipped" in err.what


def _drive(answers: dict[tuple[str, ...], CommandResult]) -> tuple[list[tuple[str, ...]], DeepRead]:
    reads = deep_reads("h")
    asked: list[tuple[str, ...]] = []
    result: CommandResult | None = None
    try:
        while True:
            argv = reads.send(result)  # type: ignore[arg-type]
            asked.append(argv)
            result = answers[argv]
    except StopIteration as stop:
        return asked, stop.value


def _ok(argv: tuple[str, ...], out: str, status: int = 0) -> CommandResult:
    return CommandResult(argv, status, out, "", 0.0)


def _l4_as(uuid: str) -> str:
    return L4.replace(parse_deep_query("h", L4).gpus[0].uuid, uuid)


@pytest.mark.parametrize(
    ("answer", "level", "needle"),
    [
        (V100_NVLINK, Level.CRITICAL, "NVLink link(s) 3, 5 inactive"),
        ("", Level.OK, "no NVLink on these GPUs: skipped"),  # a PCIe card
        ("NVLink is not supported\n", Level.OK, "no NVLink on these GPUs: skipped"),
    ],
)
def test_deep_reads_run_nvlink_status_after_the_xml(answer: str, level: Level, needle: str) -> None:
    uuid = "GPU-3c1f0a52-7e4b-4d0e-9a61-2b8d5f7c0e93"
    answers = {
        DEEP_QUERY_ARGV: _ok(DEEP_QUERY_ARGV, _l4_as(uuid)),
        NVLINK_ARGV: _ok(NVLINK_ARGV, answer),
        DCGMI_DIAG_ARGV: _ok(DCGMI_DIAG_ARGV, "", 127),
    }
    asked, read = _drive(answers)
    assert asked == [DEEP_QUERY_ARGV, NVLINK_ARGV, DCGMI_DIAG_ARGV]
    (nv,) = [f for f in deep_report("h", read, None, None, 1).findings if f.check == Check.NVLINK]
    assert (nv.level, needle in nv.what) == (level, True), nv


def test_a_failing_nvlink_status_is_a_skip_and_a_failed_query_does_not_run_it() -> None:
    answers = {
        DEEP_QUERY_ARGV: _ok(DEEP_QUERY_ARGV, L4),
        NVLINK_ARGV: _ok(NVLINK_ARGV, "Invalid combination of input arguments.", 2),
        DCGMI_DIAG_ARGV: _ok(DCGMI_DIAG_ARGV, "", 127),
    }
    _, read = _drive(answers)
    report = deep_report("h", read, None, None, 1)
    (nv,) = [f for f in report.findings if f.check == Check.NVLINK]
    assert nv.level == Level.OK and "exit 2" in nv.what and "skipped" in nv.what
    answers[DEEP_QUERY_ARGV] = _ok(DEEP_QUERY_ARGV, "", 9)  # no driver: nothing to link
    asked, read = _drive(answers)
    assert asked == [DEEP_QUERY_ARGV, DCGMI_DIAG_ARGV]
    assert not [
        f for f in deep_report("h", read, None, None, 1).findings if f.check == Check.NVLINK
    ]


# A kernel upgraded without its NVIDIA module rebuilt: after the boot every nvidia-smi
# says it cannot talk to the driver (tests/samples/SOURCES.md, GoogleCloudPlatform/
# compute-gpu-installation#18).
NO_DRIVER = (SAMPLES / "nvidia_smi_no_driver_after_kernel_upgrade.txt").read_text()


def test_gpus_that_cannot_be_read_fail_the_deep_check_and_claim_nothing() -> None:
    # Was: "ok driver library matches the kernel module" and warnings only, so a host
    # whose driver did not load passed its check after a reboot and went back to work.
    answers = {
        DEEP_QUERY_ARGV: _ok(DEEP_QUERY_ARGV, NO_DRIVER, 9),
        DCGMI_DIAG_ARGV: _ok(DCGMI_DIAG_ARGV, "", 127),
    }
    asked, read = _drive(answers)
    assert asked == [DEEP_QUERY_ARGV, DCGMI_DIAG_ARGV]
    report = deep_report("h", read, None, "nvidia-smi failed (exit 9)", 8)
    assert report.level == Level.CRITICAL, report.text()
    (driver,) = [f for f in report.findings if f.check == Check.DRIVER]
    assert driver.level == Level.CRITICAL and "couldn't communicate" in driver.what
    assert "could not be read" in driver.what and "lsmod" in driver.action
    assert "matches the kernel module" not in report.text()


def _unreported(text: str, na: str) -> str:
    """The L4 capture with every PCIe link value and the clock event reasons ``na``, as a
    vGPU reports them: an RTXA6000-24Q on 535.183.06 prints N/A for PCIe Generation Max
    and Current, Link Width Max and Current, and Clocks Event Reasons (tests/samples/
    SOURCES.md; its `nvidia-smi -q`, the XML tags here hold the same values)."""
    tags = "max_link_gen|current_link_gen|max_link_width|current_link_width"
    text = re.sub(rf"<({tags})>[^<]*<", rf"<\1>{na}<", text)
    reasons = f"<clocks_event_reasons>{na}</clocks_event_reasons>"
    return re.sub(r"<clocks_event_reasons>.*?</clocks_event_reasons>", reasons, text, flags=re.S)


@pytest.mark.parametrize("na", ["N/A", "[N/A]"])
def test_a_gpu_reporting_no_pcie_link_or_clock_reasons_passes_and_says_not_judged(
    na: str,
) -> None:
    # Good but unusual: it passes. Unknown: it is said not judged, never "x16" or "no HW
    # slowdown" (was: no PCIe line at all, and "no HW or thermal clock slowdown").
    (r,) = parse_deep_query("h", _unreported(L4, na)).gpus
    assert (r.pcie_gen, r.pcie_gen_max, r.pcie_width, r.pcie_width_max) == (None,) * 4
    assert r.throttle == () and r.gpu_idle is None
    found = judge_gpus([r])
    (pcie,) = [f for f in found if f.check == Check.PCIE]
    assert pcie.level == Level.OK and pcie.what == "PCIe link not reported: not judged"
    (clocks,) = [f for f in found if f.check == Check.THROTTLE]
    assert clocks.level == Level.OK
    assert clocks.what == "clock event reasons not reported: not judged"
