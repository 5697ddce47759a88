"""The NVSwitch fabric in the deep GPU check (issue 23; NVIDIA/NVSentinel#883, #889): Fabric
Manager's registration state of each GPU and the NVLink links of an NVSwitch system, judged
on real captures (tests/samples/deep, sources in tests/samples/SOURCES.md).

No public ``nvidia-smi -q -x`` with a fabric state was found: the ``Fabric`` captures are
of the text ``nvidia-smi -q``. Each test reads its capture's ``State`` and ``Status`` words
and puts them in the real L4 XML capture's ``<fabric>`` tags, where ``-q -x`` prints the
same words; nothing here types a state by hand but the one unknown word.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.core.deep_check import FABRIC_STUCK, Check, DeepFinding, judge_gpus, judge_nvlink
from bot.core.deep_query import DeepReading, NvLinks, parse_deep_query, parse_nvlink
from bot.core.health_types import Level

SAMPLES = Path(__file__).parent / "samples" / "deep"
L4 = (SAMPLES / "nvidia_smi_qx_l4_555.xml").read_text()
IN_PROGRESS = "nvidia_smi_q_fabric_in_progress_580.txt"  # NVIDIA/gpu-operator#2511
COMPLETED = "nvidia_smi_q_fabric_completed_550.txt"  # a set-up note, fabricmanager 550.90.07
INSUFFICIENT = "nvidia_smi_q_fabric_insufficient_resources.txt"  # Azure/azhpc-images#506


def fabric_words(name: str) -> tuple[str, str]:
    """The ``State`` and ``Status`` of a captured ``nvidia-smi -q`` Fabric block."""
    text = (SAMPLES / name).read_text()

    def word(key: str) -> str:
        m = re.search(rf"^\s*{key}\s*:\s*(.+?)\s*$", text, re.M)
        assert m is not None, (name, key)
        return m.group(1)

    return word("State"), word("Status")


def with_fabric(state: str, status: str, xml: str = L4) -> str:
    """The L4 capture with its fabric ``<state>``/``<status>`` (``N/A`` there) set."""
    assert "<state>N/A</state>" in xml and "<status>N/A</status>" in xml
    return xml.replace("<state>N/A</state>", f"<state>{state}</state>").replace(
        "<status>N/A</status>", f"<status>{status}</status>"
    )


def gpu_of(name: str) -> DeepReading:
    (r,) = parse_deep_query("h", with_fabric(*fabric_words(name))).gpus
    return r


def fabric(found: list[DeepFinding]) -> DeepFinding:
    (f,) = [f for f in found if f.check == Check.FABRIC]
    return f


def test_the_captured_words_read_through_the_xml_parser() -> None:
    assert fabric_words(IN_PROGRESS) == ("In Progress", "N/A")
    assert fabric_words(COMPLETED) == ("Completed", "Success")
    assert fabric_words(INSUFFICIENT) == ("Completed", "Insufficient Resources")
    r = gpu_of(IN_PROGRESS)
    assert (r.fabric_state, r.fabric_status) == ("In Progress", None)  # N/A: no status
    assert (gpu_of(COMPLETED).fabric_state, gpu_of(COMPLETED).fabric_status) == (
        "Completed",
        "Success",
    )


def test_a_completed_fabric_passes_alone_and_after_the_wait() -> None:
    for waited in (None, 120.0):
        f = fabric(judge_gpus([gpu_of(COMPLETED)], fabric_waited=waited))
        assert (f.level, f.what) == (Level.OK, "fabric Completed, Success")


def test_a_stuck_fabric_fails_after_the_wait_and_warns_as_transitional_alone() -> None:
    # Stand-alone (`gpus --deep`): a boot in progress cannot be told from a stuck one, so
    # a warning that says so, with NVIDIA's action.
    alone = fabric(judge_gpus([gpu_of(IN_PROGRESS)]))
    assert alone.level == Level.WARN and "transitional" in alone.what
    assert alone.action == FABRIC_STUCK
    # After a reboot or reset the host run waited for it: still registering is a FAIL.
    after = fabric(judge_gpus([gpu_of(IN_PROGRESS)], fabric_waited=120.0))
    assert after.level == Level.CRITICAL
    assert after.what == "fabric In Progress, still after waiting 120s for it (fabric_wait_s)"
    assert "systemctl status nvidia-fabricmanager" in after.action and "802" in after.action
    # "Not Started", the state before it (NVSentinel#883), the same way.
    (r,) = parse_deep_query("h", with_fabric("Not Started", "N/A")).gpus
    assert fabric(judge_gpus([r])).level == Level.WARN
    assert fabric(judge_gpus([r], fabric_waited=5.0)).level == Level.CRITICAL


def test_a_completed_registration_that_failed_fails_at_once() -> None:
    # Azure/azhpc-images#506: it "passed validation and returned to production".
    for waited in (None, 120.0):
        f = fabric(judge_gpus([gpu_of(INSUFFICIENT)], fabric_waited=waited))
        assert f.level == Level.CRITICAL and "Insufficient Resources" in f.what


def test_an_unknown_fabric_word_or_a_missing_status_is_never_a_pass() -> None:
    (odd,) = parse_deep_query("h", with_fabric("Degraded", "N/A")).gpus
    assert fabric(judge_gpus([odd])).level == Level.CRITICAL
    (mute,) = parse_deep_query("h", with_fabric("Completed", "N/A")).gpus
    f = fabric(judge_gpus([mute]))
    assert f.level == Level.WARN and "not judged" in f.what
    # No fabric at all (the L4, a PCIe card; an A100 HGX says N/A too): not a finding.
    (l4,) = parse_deep_query("h", L4).gpus
    assert [f for f in judge_gpus([l4]) if f.check == Check.FABRIC] == []


def _hgx(capture: str, state: str | None, status: str | None) -> list[DeepReading]:
    """Each GPU of an ``nvidia-smi nvlink -s`` capture, with a fabric state."""
    return [
        DeepReading(g.uuid, "?", fabric_state=state, fabric_status=status, nvlink=g.links)
        for g in parse_nvlink((SAMPLES / capture).read_text())
    ]


def _levels(found: list[DeepFinding]) -> set[Level]:
    return {f.level for f in found}


def test_a_good_hgx_passes_and_a_pcie_card_is_never_failed_for_nvlink() -> None:
    # An HGX H100 whose fabric completed, every link up (bottlerocket#4418): passes, as
    # after the wait.
    state, status = fabric_words(COMPLETED)
    h100 = _hgx("nvidia_smi_nvlink_s_h100_hgx.txt", state, status)
    assert len(h100) == 2 and all(r.nvlink == NvLinks(up=tuple(range(18))) for r in h100)
    for waited in (None, 60.0):
        found = judge_gpus(h100, fabric_waited=waited) + judge_nvlink(h100, fabric_waited=waited)
        assert _levels(found) == {Level.OK}, found
    # An 8 x A100 HGX (leptonai/gpud's capture): no fabric state (A100s report N/A), 12
    # links up on each GPU: passes.
    a100 = _hgx("nvidia_smi_nvlink_s_a100_hgx.txt", None, None)
    assert len(a100) == 8 and {len(r.nvlink.up) for r in a100 if r.nvlink} == {12}
    assert _levels(judge_nvlink(a100)) == {Level.OK}
    # A PCIe card (the L4): no NVLink, no fabric: skipped and said, never a failure.
    (l4,) = parse_deep_query("h", L4).gpus
    (skip,) = judge_nvlink([l4], fabric_waited=60.0)
    assert skip.level == Level.OK and "skipped" in skip.what


def test_every_link_down_on_an_nvswitch_system_fails() -> None:
    # Every GPU as the B200 of leptonai/gpud#1085 prints it: "all links are inActive".
    (b200,) = parse_nvlink((SAMPLES / "nvidia_smi_nvlink_s_b200_all_inactive.txt").read_text())
    assert b200.links == NvLinks(all_down=True)

    def host(state: str | None, status: str | None) -> list[DeepReading]:
        return [
            DeepReading(f"g{i}", "?", fabric_state=state, fabric_status=status, nvlink=b200.links)
            for i in range(8)
        ]

    # The GPUs report a fabric state: an NVSwitch system, its fabric down: FAIL.
    down = judge_nvlink(host(*fabric_words(COMPLETED)))
    assert _levels(down) == {Level.CRITICAL} and len(down) == 8
    assert "NVSwitch system" in down[0].what and "Fabric Manager" in down[0].action
    # While every GPU is still registering, alone: a warning; once waited for: FAIL.
    stuck = host(*fabric_words(IN_PROGRESS))
    assert _levels(judge_nvlink(stuck)) == {Level.WARN}
    assert _levels(judge_nvlink(stuck, fabric_waited=120.0)) == {Level.CRITICAL}
    # No fabric state (NVLink cards without a bridge, an A100 HGX): not judged a failure.
    (none, *_) = judge_nvlink(host(None, None), fabric_waited=120.0)
    assert none.level == Level.OK and "no link active on any GPU" in none.what


@pytest.mark.parametrize("gpus", [1, 8])
def test_a_gpu_reporting_a_fabric_beside_one_that_does_not_still_counts(gpus: int) -> None:
    # One GPU's state is enough to call the host an NVSwitch system.
    (b200,) = parse_nvlink((SAMPLES / "nvidia_smi_nvlink_s_b200_all_inactive.txt").read_text())
    readings = [DeepReading(f"g{i}", "?", nvlink=b200.links) for i in range(gpus)]
    readings[0] = DeepReading(
        "g0", "?", fabric_state="Completed", fabric_status="Success", nvlink=b200.links
    )
    assert _levels(judge_nvlink(readings)) == {Level.CRITICAL}
