"""The import gate between install and start: what the new venv imports, and whether the
driver can run the CUDA build of torch it holds.

Pure. The gate runs the service's own interpreter on ``GATE_CODE`` (a constant: nothing
from a user or the config is in it), which imports vllm and torch and prints one line
``chatops-gate {"vllm": ..., "torch": ..., "cuda": ...}`` (``torch.version.cuda`` is
None for a CPU build). Importing is what a failed model load would show minutes later;
the import takes seconds.

The driver's CUDA version is the highest CUDA it supports, from the header of plain
``nvidia-smi``: ``| NVIDIA-SMI 570.124.06  Driver Version: 570.124.06  CUDA Version: 12.8 |``
(drivers up to R580), or ``... KMD Version: 610.43.02  CUDA UMD Version: 13.3 |``
(R610 on). A torch built for a newer CUDA *major* version than that cannot initialise
CUDA on this driver (vllm-project/vllm#14608: CUDA 12 wheels on a CUDA 11 driver). A
newer *minor* of the same major runs: CUDA's minor-version compatibility lets a
toolkit 12.x application run on any driver of the 12 series (pytorch/pytorch#155141: a
cu128 torch on a driver that reports 12.4), without what needs the newer driver (PTX
JIT of code built for the newer minor). So that is a warning, never a refusal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from bot.core.versions import same_release

GATE_MARK = "chatops-gate "
# Runs as `python -c GATE_CODE`. The traceback of a failed import goes to stderr (the
# step's output); exit 3 says the import failed, as opposed to Python not starting.
# One line, with single spaces and none of the characters sudoers cannot match
# literally (a backslash, a wildcard): on a sudo host it runs as the venv's owner under
# an exact rule (bot.core.sudoers), and a rule cannot hold a newline, so no try block:
# an exception hook ends a failed import with exit 3.
GATE_CODE = (
    "import json, os, sys, traceback; "
    "sys.excepthook = lambda t, v, b: (traceback.print_exception(t, v, b), "
    "sys.stderr.flush(), os._exit(3)); "
    "import vllm, torch; "
    "sys.excepthook = sys.__excepthook__; "
    f"print({GATE_MARK!r} + json.dumps({{'vllm': getattr(vllm, '__version__', None), "
    "'torch': getattr(torch, '__version__', None), "
    "'cuda': getattr(getattr(torch, 'version', None), 'cuda', None)}), flush=True)"
)
IMPORT_FAILED_EXIT = 3

_DRIVER_CUDA = re.compile(r"CUDA (?:UMD )?Version:\s*(?P<v>[0-9]+(?:\.[0-9]+)*)")


@dataclass(frozen=True, slots=True)
class GateReport:
    """What the venv's interpreter said it imports."""

    vllm: str | None
    torch: str | None
    cuda: str | None  # torch.version.cuda; None: a CPU build (or not said)


def parse_gate_output(stdout: str) -> GateReport | None:
    """The gate's line, or None when the interpreter printed none (it failed first)."""
    for line in reversed(stdout.splitlines()):
        if not line.startswith(GATE_MARK):
            continue
        try:
            data = json.loads(line[len(GATE_MARK) :])
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        vllm, torch, cuda = (
            None if data.get(k) is None else str(data[k]) for k in ("vllm", "torch", "cuda")
        )
        return GateReport(vllm, torch, cuda)
    return None


def parse_driver_cuda(nvidia_smi: str) -> str | None:
    """The CUDA version the driver supports, from plain ``nvidia-smi``'s header; None
    when the output has no such field (unknown stays unknown)."""
    m = _DRIVER_CUDA.search(nvidia_smi)
    return m["v"] if m is not None else None


def _major_minor(text: str) -> tuple[int, int] | None:
    try:
        release = Version(text).release
    except InvalidVersion:
        return None
    return release[0], release[1] if len(release) > 1 else 0


@dataclass(frozen=True, slots=True)
class GateVerdict:
    ok: bool
    check: str  # which check decided: "import", "vllm version", "CUDA", or "all"
    reason: str
    # Said on a passing gate's step: torch built for a newer CUDA minor than the driver's.
    warning: str | None = None


def gate_verdict(
    report: GateReport | None, *, target: str | None, driver_cuda: str | None, package: str = "vllm"
) -> GateVerdict:
    """Whether the new venv may start: it imports, holds the target vLLM (the same
    release: ``vllm.__version__`` has no ``+cu129`` label, ``bot.core.versions``), and
    its torch's CUDA build is of no newer major version than the driver supports (a
    newer minor is a warning). An unknown target or driver version is not compared (and
    the reason says so), never taken for a match."""
    if report is None or report.vllm is None or report.torch is None:
        return GateVerdict(False, "import", "import vllm, torch failed")
    if target is not None and not same_release(report.vllm, target):
        return GateVerdict(
            False, f"{package} version", f"{package} {report.vllm} is installed, not {target}"
        )
    if report.cuda is None:
        return GateVerdict(
            False,
            "CUDA",
            f"torch {report.torch} is a CPU build "
            "(torch.version.cuda is None): vLLM would not find a GPU",
        )
    found = f"{package} {report.vllm}, torch {report.torch} (CUDA {report.cuda})"
    if driver_cuda is None:
        return GateVerdict(
            True, "all", f"{found}; the driver's CUDA version is unknown, not compared"
        )
    built, supported = _major_minor(report.cuda), _major_minor(driver_cuda)
    if built is None or supported is None:
        return GateVerdict(True, "all", f"{found}; driver CUDA {driver_cuda} not comparable")
    if built[0] > supported[0]:
        return GateVerdict(
            False,
            "CUDA",
            f"torch {report.torch} is built for CUDA "
            f"{report.cuda}, newer than the {driver_cuda} the driver supports "
            "(another major version: minor-version compatibility does not "
            "cross it)",
        )
    if built > supported:
        warning = (
            f"torch's CUDA {report.cuda} is newer than the {driver_cuda} the driver "
            "reports; it runs under CUDA minor-version compatibility, without what "
            f"needs a CUDA {report.cuda} driver (PTX JIT)"
        )
        return GateVerdict(
            True,
            "all",
            f"{found}; the driver reports CUDA {driver_cuda}; WARNING: {warning}",
            warning,
        )
    return GateVerdict(True, "all", f"{found}; driver supports CUDA {driver_cuda}")
