"""The deep GPU check's parsers and verdict on real captured output (tests/samples/deep,
sources in tests/samples/SOURCES.md): a bad GPU is flagged and a good one is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.dcgm import DiagResult, parse_diag
from bot.core.deep_check import (
    RESEAT,
    Check,
    DeepFinding,
    DeepReport,
    judge_count,
    judge_dcgm,
    judge_driver,
    judge_gpus,
)
from bot.core.deep_query import MISMATCH_EXIT, mismatch_of, parse_deep_query
from bot.core.health_types import Level
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


@pytest.mark.parametrize(
    ("state", "status", "level"),
    [
        ("Completed", "Success", Level.OK),
        ("In Progress", "N/A", Level.WARN),
        ("Not Started", "N/A", Level.CRITICAL),
        ("Completed", "Failure", Level.CRITICAL),
    ],
)
def test_fabric_manager_state_where_present(state: str, status: str, level: Level) -> None:
    nvswitch = L4.replace("<state>N/A</state>", f"<state>{state}</state>").replace(
        "<status>N/A</status>", f"<status>{status}</status>"
    )
    (r,) = parse_deep_query("h", nvswitch).gpus
    assert _levels(judge_gpus([r]), Check.FABRIC) == [level]


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
