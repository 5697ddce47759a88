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
JIT of code built for the newer minor). So that is a warning, never a refusal. A refusal
for another major names where the build for the driver's major comes from: an index of
the service's config whose URL is such a build's (``.../cu129``), else PyTorch's index of
it (since torch 2.10 PyPI's default wheel is a CUDA 13 build: a 12.x driver needs the
cu129 one). A driver or torch whose CUDA version cannot be read is refused too: unknown
is never taken for "it runs".

``resolved_build`` names the CUDA build an install resolved, for the approval card: the
torch wheel's label (``2.13.0+cu129``: PyTorch's and vLLM's CUDA indexes label their
wheels), else the CUDA wheels torch pulls in from PyPI (``cuda-toolkit==13.0.3.0`` for
torch 2.13's default wheel, ``nvidia-cuda-runtime-cu12==12.8.90`` for torch 2.9's).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from packaging.version import InvalidVersion, Version

from bot.core.versions import cuda_label, cuda_of_label, same_release

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
    report: GateReport | None,
    *,
    target: str | None,
    driver_cuda: str | None,
    package: str = "vllm",
    indexes: Mapping[str, str] | None = None,
) -> GateVerdict:
    """Whether the new venv may start: it imports, holds the target vLLM (the same
    release: ``vllm.__version__`` has no ``+cu129`` label, ``bot.core.versions``), and
    its torch's CUDA build is of no newer major version than the driver supports (a
    newer minor is a warning). An unknown target is not compared (the reason says so);
    a driver or torch CUDA version that cannot be read refuses: nothing says it runs.
    ``indexes``: the service's configured indexes, for where a refusal says the build
    for this driver comes from."""
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
    built = _major_minor(report.cuda)
    if driver_cuda is None:
        return GateVerdict(
            False,
            "CUDA",
            f"{found}; the driver's CUDA version is unknown (plain nvidia-smi's header "
            "said none): nothing says this torch runs on it",
        )
    supported = _major_minor(driver_cuda)
    if built is None or supported is None:
        return GateVerdict(
            False,
            "CUDA",
            f"{found}; torch's CUDA {report.cuda} and the driver's {driver_cuda} cannot "
            "be compared: nothing says this torch runs on it",
        )
    if built[0] > supported[0]:
        return GateVerdict(
            False,
            "CUDA",
            f"torch {report.torch} is built for CUDA "
            f"{report.cuda}, newer than the {driver_cuda} the driver supports "
            "(another major version: minor-version compatibility does not "
            f"cross it); {build_advice(supported[0], indexes or {})}",
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


# ---- which CUDA build, and where the one for a driver comes from ------------------------------

# The newest CUDA minor PyTorch and vLLM build for, per major: a driver of that major runs
# it (a driver of an older minor under minor-version compatibility, with the warning).
# PyTorch's cu129 index (torch 2.8 on) is the CUDA 12 build once PyPI's default wheel is
# a CUDA 13 one (torch 2.10 on: tests/samples/SOURCES.md).
_NEWEST_MINOR = {11: "11.8", 12: "12.9", 13: "13.0"}
PYTORCH_INDEX = "https://download.pytorch.org/whl/{label}"


def _serves(url: str, label: str) -> bool:
    """Whether an index URL is one of a CUDA build's: a path segment is its label
    (download.pytorch.org/whl/cu129, wheels.vllm.ai/0.31.0/cu129, .../nightly/cu129)."""
    return label in urlsplit(url).path.lower().split("/")


def build_advice(driver_major: int, indexes: Mapping[str, str]) -> str:
    """Where the build for a driver of ``driver_major`` comes from: the configured index
    that serves it (named, never its URL: it may hold a credential), else PyTorch's
    index of it, to be configured."""
    cuda = _NEWEST_MINOR.get(driver_major)
    label = None if cuda is None else cuda_label(cuda)
    if cuda is None or label is None:
        return f"this driver needs a torch built for CUDA {driver_major}.x"
    for name, url in sorted(indexes.items()):
        if _serves(url, label):
            return (
                f"the {label} build (CUDA {cuda}) runs on this driver and the configured "
                f"index `{name}` serves it: redeploy with `--index {name}`"
            )
    return (
        f"the {label} build (CUDA {cuda}) runs on this driver: PyTorch serves it at "
        f"{PYTORCH_INDEX.format(label=label)} (vLLM's at "
        f"https://wheels.vllm.ai/<version>/{label}); add such an index to this "
        "service's `indexes` and redeploy with `--index <name>`"
    )


@dataclass(frozen=True, slots=True)
class CudaBuild:
    """The CUDA build of the torch an environment holds (or an install resolves)."""

    torch: str  # its version, "2.13.0+cu129"
    cuda: str | None  # "12.9"; None for a CPU build or when nothing says
    evidence: str  # what says it: "its label", "cuda-toolkit 13.0.3.0", "" (nothing)
    cpu: bool = False

    def describe(self) -> str:
        """``torch 2.13.0+cu129 (CUDA 12.9, cu129 build)``, ``torch 2.13.0 (CUDA 13.0,
        from cuda-toolkit 13.0.3.0)``, ``torch 2.13.0+cpu (a CPU build)``, or ``torch
        2.13.0 (CUDA build not known)``."""
        if self.cpu:
            return f"torch {self.torch} (a CPU build)"
        if self.cuda is None:
            return f"torch {self.torch} (CUDA build not known)"
        if self.evidence == _LABEL:
            return f"torch {self.torch} (CUDA {self.cuda}, {cuda_label(self.cuda)} build)"
        return f"torch {self.torch} (CUDA {self.cuda}, from {self.evidence})"


_LABEL = "its label"
# The wheels whose version is the CUDA version torch was built for: CUDA 13's are
# unsuffixed (torch 2.13 requires cuda-toolkit[cudart,...]==13.0.3, which brings
# nvidia-cuda-runtime 13.0.96), CUDA 12's and 11's carry the major (-cu12).
_RUNTIME = re.compile(r"^(?:cuda-toolkit|nvidia-cuda-runtime(?:-cu(?P<major>\d+))?)$")


def _runtime_cuda(name: str, version: str) -> str | None:
    m = _RUNTIME.match(name)
    mm = _major_minor(version) if m is not None else None
    if m is None or mm is None or (m["major"] is not None and int(m["major"]) != mm[0]):
        return None
    return f"{mm[0]}.{mm[1]}"


def resolved_build(versions: Mapping[str, str], changed: Iterable[str] = ()) -> CudaBuild | None:
    """The CUDA build of the torch in ``versions`` (canonical name -> version); None when
    there is no torch. Its label says it; else the CUDA runtime wheels do, those the
    change installs (``changed``) before those it leaves (uv never removes a package: a
    move to CUDA 13 leaves the -cu12 wheels behind). Runtime wheels that disagree say
    nothing: the build is then not known."""
    torch = versions.get("torch")
    if torch is None:
        return None
    if torch.lower().endswith(("+cpu", ".cpu")):
        return CudaBuild(torch, None, _LABEL, cpu=True)
    labelled = cuda_of_label(torch)
    if labelled is not None:
        return CudaBuild(torch, labelled, _LABEL)
    moved = set(changed)
    for pool in ([n for n in versions if n in moved], list(versions)):
        said = {
            (n, versions[n], c) for n in pool if (c := _runtime_cuda(n, versions[n])) is not None
        }
        cudas = {c for _, _, c in said}
        if len(cudas) == 1:
            name, version, cuda = min(said)
            return CudaBuild(torch, cuda, f"{name} {version}")
        if len(cudas) > 1:
            return CudaBuild(torch, None, "")
    return CudaBuild(torch, None, "")
