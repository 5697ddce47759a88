"""The deep GPU check's verdict (issue 23): pure judging of what ``deep_query`` and
``dcgm`` parsed (or NVML read), the health check's verdict, and the host's last known GPU
count. Every finding has a level and NVIDIA's recommended action; ok findings are kept
too, so the report says what was checked, not only what failed.

Levels are the health check's (``ok``, ``warn``, ``critical``); the report prints
critical as ``FAIL``: a host with one should not go back to work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from bot.core.dcgm import DiagReport
from bot.core.deep_query import THROTTLE_REASONS, DeepReading, Mismatch, NvLinks
from bot.core.health_types import HostHealth, Level, worst

WORDS = {Level.OK: "ok", Level.WARN: "warn", Level.CRITICAL: "FAIL"}

# NVIDIA's actions, paraphrased from the nvidia-smi man page, the NVML clock event
# reasons and the Fabric Manager user guide.
RESEAT = "reseat the GPU or its riser/cable and check the slot's BIOS PCIe setting"
COOLING = "check the GPU's cooling and the node's power supply (HW slowdown halves clocks)"
PERSIST = "enable persistence mode (nvidia-persistenced, or nvidia-smi -pm 1 as root)"
FABRIC = "check nvidia-fabricmanager (systemctl status nvidia-fabricmanager) and its log"
# Fabric Manager registers each GPU of an NVSwitch system with the fabric: "Not Started",
# then "In Progress", then "Completed" (NVIDIA/NVSentinel#883). The first two are expected
# for a while after a boot or a reset; one that stays means Fabric Manager is not running,
# usually after a driver upgrade without the matching fabricmanager package, and every
# CUDA program fails with error 802 until it completes (NVSentinel#889: 20 days unseen).
TRANSITIONAL = frozenset({"Not Started", "In Progress"})
FABRIC_STUCK = (
    "start nvidia-fabricmanager and check that its version matches the driver's "
    "(systemctl status nvidia-fabricmanager, journalctl -u nvidia-fabricmanager); until "
    "the fabric completes, CUDA fails with error 802 (system not yet initialized)"
)
MISMATCH = (
    "reboot the node: the NVIDIA user-space library was upgraded under the loaded kernel "
    "module (or unload and reload the nvidia modules once no process uses them)"
)
LOST = "a GPU is not enumerated: look for Xid 79 in the kernel log, then reboot or reseat"
DCGM = "see dcgmi diag's message; rerun with -r 2 once the cause is fixed"
# DCGM's own words for a link down (DCGM_FR_NVLINK_DOWN): "Run a field diagnostic on the
# GPU"; NVSwitch systems first need Fabric Manager, and a bridge or the GPU reseated.
NVLINK = (
    "NVLink down: check the NVSwitch/Fabric Manager (systemctl status "
    "nvidia-fabricmanager), reseat the GPU or its NVLink bridge; NVIDIA: run a field "
    "diagnostic (dcgmi diag -r 2)"
)
NVML_FAILED = "check the bot's NVML (the driver, libnvidia-ml.so.1, /dev/nvidia* access)"
# nvidia-smi could not read the GPUs at all (the driver not loaded: a kernel upgraded
# without its NVIDIA module rebuilt, the classic failure after a reboot): an unknown, so
# a FAIL, never a pass.
UNREAD = (
    "nothing says the GPUs are fit: check that the NVIDIA kernel module is loaded "
    "(`lsmod | grep nvidia`, `dkms status`, the kernel log), then rerun the check"
)


class Check(StrEnum):
    HEALTH = "health"  # the existing checks (ECC, remaps, reset status, Xid)
    PCIE = "pcie"
    THROTTLE = "throttle"
    PERSISTENCE = "persistence"
    FABRIC = "fabric"
    DRIVER = "driver"
    GPU_COUNT = "gpu count"
    DCGM = "dcgm"
    NVLINK = "nvlink"
    NVML = "nvml"  # where the readings came from on the bot's own host


@dataclass(frozen=True, slots=True)
class DeepFinding:
    check: Check
    level: Level
    what: str
    action: str = ""
    gpu: str | None = None  # "GPU 0"; None for the host

    def line(self) -> str:
        where = f"{self.gpu}: " if self.gpu else ""
        tail = f" -> {self.action}" if self.action and self.level != Level.OK else ""
        return f"{WORDS[self.level]:<4} {self.check.value:<11} {where}{self.what}{tail}"


@dataclass(frozen=True, slots=True)
class DeepReport:
    host: str
    findings: tuple[DeepFinding, ...]

    @property
    def level(self) -> Level:
        return worst(f.level for f in self.findings)

    def head(self) -> str:
        return f"{self.host}: deep GPU check {WORDS[self.level]}"

    def text(self) -> str:
        return "\n".join([self.head(), *(f"  {f.line()}" for f in self.findings)])

    def summary(self) -> str:
        """The verdict and only the findings that need a look (the ok ones counted): what
        a short answer shows of this host."""
        shown = [f for f in self.findings if f.level != Level.OK]
        ok = len(self.findings) - len(shown)
        head = self.head() + (f" ({ok} of {len(self.findings)} checks ok)" if ok else "")
        return "\n".join([head, *(f"  {f.line()}" for f in shown)])


def _pcie(gpu: str, r: DeepReading) -> list[DeepFinding]:
    out: list[DeepFinding] = []
    if r.pcie_width is not None and r.pcie_width_max is not None:
        # Width is judged strictly: a data-centre GPU keeps its lanes when idle, and a
        # narrower link is a seating or signal fault (NVSentinel issue #890).
        if r.pcie_width < r.pcie_width_max:
            what = f"PCIe link x{r.pcie_width} of x{r.pcie_width_max}"
            out.append(DeepFinding(Check.PCIE, Level.CRITICAL, what, RESEAT, gpu))
        else:
            out.append(DeepFinding(Check.PCIE, Level.OK, f"PCIe width x{r.pcie_width}", gpu=gpu))
    if r.pcie_gen is not None and r.pcie_gen_max is not None:
        what = f"PCIe gen{r.pcie_gen} of gen{r.pcie_gen_max}"
        # Generation with care: GPUs drop to gen1 when idle to save power (nvidia-smi's
        # help: "may be reduced when the GPU is not in use"; nvtop issue #6), so a low
        # generation is only a warning on a GPU that has work.
        if r.pcie_gen >= r.pcie_gen_max:
            out.append(DeepFinding(Check.PCIE, Level.OK, what, gpu=gpu))
        elif r.gpu_idle is not False:
            out.append(DeepFinding(Check.PCIE, Level.OK, f"{what} while idle", gpu=gpu))
        else:
            out.append(DeepFinding(Check.PCIE, Level.WARN, f"{what} under load", RESEAT, gpu))
    if not out:
        # N/A (a vGPU, some SKUs): nothing to judge, and said so, not taken for x16.
        out.append(DeepFinding(Check.PCIE, Level.OK, "PCIe link not reported: not judged", gpu=gpu))
    return out


def _throttle(gpu: str, r: DeepReading) -> list[DeepFinding]:
    if not r.throttle and r.gpu_idle is None:
        # The reasons were not reported (N/A): no slowdown is known, none is ruled out.
        what = "clock event reasons not reported: not judged"
        return [DeepFinding(Check.THROTTLE, Level.OK, what, gpu=gpu)]
    if not r.throttle:
        return [DeepFinding(Check.THROTTLE, Level.OK, "no HW or thermal clock slowdown", gpu=gpu)]
    out = []
    for reason in r.throttle:
        # Software thermal slowdown is the driver keeping under its limit: a warning;
        # the hardware ones mean the board itself cut the clocks.
        level = Level.WARN if reason == "sw_thermal_slowdown" else Level.CRITICAL
        what = f"clocks held back: {THROTTLE_REASONS[reason]}"
        out.append(DeepFinding(Check.THROTTLE, level, what, COOLING, gpu))
    return out


def _persistence(gpu: str, r: DeepReading) -> list[DeepFinding]:
    if r.persistence is None:
        return []
    if r.persistence:
        return [DeepFinding(Check.PERSISTENCE, Level.OK, "persistence mode on", gpu=gpu)]
    return [DeepFinding(Check.PERSISTENCE, Level.WARN, "persistence mode off", PERSIST, gpu)]


def _fabric(gpu: str, r: DeepReading, waited: float | None) -> list[DeepFinding]:
    """``waited``: how long a host run waited for the fabric after its reboot or reset
    (None: a stand-alone check, which cannot tell a boot in progress from a stuck one)."""
    if r.fabric_state is None:
        return []  # not an NVSwitch system
    what = f"fabric {r.fabric_state}" + (f", {r.fabric_status}" if r.fabric_status else "")
    if r.fabric_state == "Completed" and r.fabric_status == "Success":
        return [DeepFinding(Check.FABRIC, Level.OK, what, gpu=gpu)]
    if r.fabric_state == "Completed" and r.fabric_status is None:
        # nvidia-smi prints a completed registration's status; none is an unknown.
        what += " (its status not reported: not judged)"
        return [DeepFinding(Check.FABRIC, Level.WARN, what, FABRIC, gpu)]
    if r.fabric_state not in TRANSITIONAL:
        return [DeepFinding(Check.FABRIC, Level.CRITICAL, what, FABRIC, gpu)]  # any other
    if waited is None:
        what += (
            " (transitional: Fabric Manager has not finished registering this GPU; after "
            "a reboot or reset the host run waits fabric_wait_s for it, then fails it)"
        )
        return [DeepFinding(Check.FABRIC, Level.WARN, what, FABRIC_STUCK, gpu)]
    what += f", still after waiting {waited:.0f}s for it (fabric_wait_s)"
    return [DeepFinding(Check.FABRIC, Level.CRITICAL, what, FABRIC_STUCK, gpu)]


def registering(readings: Sequence[DeepReading]) -> list[DeepReading]:
    """The GPUs whose NVSwitch fabric is still registering (``TRANSITIONAL``)."""
    return [r for r in readings if r.fabric_state in TRANSITIONAL]


def judge_gpus(
    readings: Sequence[DeepReading],
    labels: Mapping[str, str] | None = None,
    fabric_waited: float | None = None,
) -> list[DeepFinding]:
    """Each GPU's PCIe link, throttle reasons, persistence mode and fabric state;
    ``labels``: uuid -> "GPU 0" from the GPU query (else by position); ``fabric_waited``:
    as ``_fabric``'s ``waited``."""
    out: list[DeepFinding] = []
    for n, r in enumerate(readings):
        gpu = (labels or {}).get(r.uuid, f"GPU {n}")
        out += _pcie(gpu, r) + _throttle(gpu, r) + _persistence(gpu, r)
        out += _fabric(gpu, r, fabric_waited)
    return out


def judge_unread(why: str) -> DeepFinding:
    """nvidia-smi could not read the GPUs (and no mismatch says why): a FAIL."""
    return DeepFinding(Check.DRIVER, Level.CRITICAL, f"{why}: the GPUs could not be read", UNREAD)


def judge_driver(mismatch: Mismatch | None) -> DeepFinding:
    if mismatch is None:
        return DeepFinding(Check.DRIVER, Level.OK, "driver library matches the kernel module")
    lib = f" (library {mismatch.library})" if mismatch.library else ""
    what = f"Driver/library version mismatch{lib}: nvidia-smi and CUDA cannot start"
    return DeepFinding(Check.DRIVER, Level.CRITICAL, what, MISMATCH)


def judge_count(now: int | None, last: int | None) -> DeepFinding:
    if now is None:
        return DeepFinding(Check.GPU_COUNT, Level.WARN, "GPU count not read", "check the driver")
    if last is None:
        return DeepFinding(Check.GPU_COUNT, Level.OK, f"{now} GPUs (first count recorded)")
    if now < last:
        return DeepFinding(Check.GPU_COUNT, Level.CRITICAL, f"{now} GPUs, {last} last time", LOST)
    if now > last:
        what = f"{now} GPUs, {last} last time (more than before)"
        return DeepFinding(Check.GPU_COUNT, Level.WARN, what, "confirm the hardware change")
    return DeepFinding(Check.GPU_COUNT, Level.OK, f"{now} GPUs, as last time")


def judge_dcgm(report: DiagReport | None, error: str | None) -> list[DeepFinding]:
    """``report`` None and ``error`` None: dcgmi is not installed (skipped, and said)."""
    if report is None and error is None:
        return [DeepFinding(Check.DCGM, Level.OK, "dcgmi not installed: DCGM diagnostics skipped")]
    if report is None or not report.ran:
        why = error or "no result table"
        action = "check nv-hostengine (systemctl status nvidia-dcgm)"
        return [DeepFinding(Check.DCGM, Level.WARN, f"dcgmi diag -r 1 did not run: {why}", action)]
    # A result in words DCGM's table does not use is not a pass: a warning, with its row.
    judged = (
        (Level.CRITICAL, report.failed()),
        (Level.WARN, report.warned()),
        (Level.WARN, report.unknown()),
    )
    out = [
        DeepFinding(
            Check.DCGM,
            lvl,
            f"{t.section}/{t.name}: {t.result}" + (f" ({t.detail})" if t.detail else ""),
            DCGM,
        )
        for lvl, tests in judged
        for t in tests
    ]
    if not out:
        out.append(DeepFinding(Check.DCGM, Level.OK, f"dcgmi diag -r 1: {_passed(report)}"))
    return out


def _passed(report: DiagReport) -> str:
    """ "9 passed", or "8 passed, 1 skipped (Stress/EUD Test)": a skip is DCGM's, not ours."""
    skipped = report.skipped()
    said = f"{len(report.tests) - len(skipped)} passed"
    if not skipped:
        return said
    names = ", ".join(f"{t.section}/{t.name}" for t in skipped)
    return f"{said}, {len(skipped)} skipped ({names})"


def judge_health(health: HostHealth | None, error: str | None) -> list[DeepFinding]:
    """The health check's own verdict, finding by finding (its levels as they are)."""
    if health is None:
        what = f"GPU health not read ({error or 'no verdict'})"
        return [DeepFinding(Check.HEALTH, Level.WARN, what, "check the driver")]
    out = [
        DeepFinding(Check.HEALTH, f.level, f.what, f.action, g.label)
        for g in health.gpus
        for f in g.findings
    ]
    out += [DeepFinding(Check.HEALTH, f.level, f.what, f.action) for f in health.host_findings]
    if not out:
        n = len(health.gpus)
        out.append(DeepFinding(Check.HEALTH, Level.OK, f"ECC, remaps, reset status, Xid: {n} ok"))
    return out


def _links(numbers: tuple[int, ...]) -> str:
    return ", ".join(str(n) for n in numbers)


def _nvlink_gpu(gpu: str, links: NvLinks, others_up: bool, none_up: Level) -> DeepFinding:
    """``none_up``: the level of a host where no GPU has a link up (``_none_up``)."""
    if links.up and (links.down or links.all_down):
        what = f"NVLink link(s) {_links(links.down)} inactive, {len(links.up)} active"
        return DeepFinding(Check.NVLINK, Level.CRITICAL, what, NVLINK, gpu)
    if not links.up:
        if others_up:
            what = "every NVLink link inactive while the other GPUs' are active"
            return DeepFinding(Check.NVLINK, Level.CRITICAL, what, NVLINK, gpu)
        if none_up == Level.OK:
            what = "NVLink: no link active on any GPU (no NVLink bridge fitted?)"
            return DeepFinding(Check.NVLINK, Level.OK, what, gpu=gpu)
        what = (
            "every NVLink link inactive on every GPU of an NVSwitch system (the GPUs report "
            "a fabric state): the NVLink fabric is down"
        )
        return DeepFinding(Check.NVLINK, none_up, what, NVLINK, gpu)
    return DeepFinding(Check.NVLINK, Level.OK, f"NVLink: {len(links.up)} links active", gpu=gpu)


def _none_up(readings: Sequence[DeepReading], waited: float | None) -> Level:
    """No GPU with a link up: NVLink cards without a bridge (ok), unless the GPUs report a
    fabric state, which only NVSwitch systems do: there the fabric is down, a FAIL (a
    warning only while every GPU's fabric is still registering and nobody waited for it,
    the stand-alone check right after a boot). An A100 system reports none (N/A) and is
    not judged so."""
    states = [r.fabric_state for r in readings if r.fabric_state is not None]
    if not states:
        return Level.OK
    if waited is None and all(s in TRANSITIONAL for s in states):
        return Level.WARN
    return Level.CRITICAL


def judge_nvlink(
    readings: Sequence[DeepReading],
    error: str | None = None,
    labels: Mapping[str, str] | None = None,
    fabric_waited: float | None = None,
) -> list[DeepFinding]:
    """Each NVLink GPU's links: one inactive beside active ones (on the GPU, or every
    link of a GPU whose peers' are up) fails. No GPU with NVLink (PCIe cards), or
    ``nvidia-smi nvlink -s`` not answering (``error``): skipped, and said. Where no GPU
    has a link up, as ``_none_up`` judges it."""
    if error is not None:
        return [DeepFinding(Check.NVLINK, Level.OK, f"NVLink not read ({error}): skipped")]
    linked = [(n, r) for n, r in enumerate(readings) if r.nvlink is not None]
    if not linked:
        return [DeepFinding(Check.NVLINK, Level.OK, "no NVLink on these GPUs: skipped")]
    any_up = any(r.nvlink.up for _, r in linked if r.nvlink is not None)
    none_up = _none_up(readings, fabric_waited)
    return [
        _nvlink_gpu((labels or {}).get(r.uuid, f"GPU {n}"), r.nvlink, any_up, none_up)
        for n, r in linked
        if r.nvlink is not None
    ]


def judge_source(nvml: bool, nvml_error: str | None) -> list[DeepFinding]:
    """On the bot's own host: NVML read the GPUs, or why ``nvidia-smi -q -x`` did."""
    if nvml_error is not None:
        what = f"NVML failed ({nvml_error}): read nvidia-smi -q -x instead"
        return [DeepFinding(Check.NVML, Level.WARN, what, NVML_FAILED)]
    if nvml:
        return [DeepFinding(Check.NVML, Level.OK, "GPU readings from NVML")]
    return []
