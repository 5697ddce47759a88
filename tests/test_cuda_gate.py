"""bot.core.cuda: the import gate's code, its output, the driver's CUDA version, the verdict.

The gate code is run here by a real Python interpreter on stand-in ``vllm`` and ``torch``
packages (what the simulated venv does too), so the parser reads what the code really
prints, tracebacks included. The test machine has no GPU and no NVIDIA driver (see
tests/samples/SOURCES.md), so no ``nvidia-smi`` header could be captured here; the header
lines below follow the two layouts as published in public nvidia-smi output:
``NVIDIA-SMI 550.135  Driver Version: 550.135  CUDA Version: 12.4`` (drivers up to R580,
e.g. slackr31337/wyoming-piper-gpu#20, rossumai/nvgpu#15) and ``NVIDIA-SMI 610.43.02
KMD Version: 610.43.02  CUDA UMD Version: 13.3`` (R610, sgl-project/sglang#27487).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bot.core.cuda import (
    GATE_CODE,
    IMPORT_FAILED_EXIT,
    GateReport,
    gate_verdict,
    parse_driver_cuda,
    parse_gate_output,
)


def run_gate(
    tmp_path: Path, vllm: str | None, torch: str | None, cuda: str | None
) -> subprocess.CompletedProcess[str]:
    """GATE_CODE in a real interpreter that finds only the stand-in packages."""
    if vllm is not None:
        (tmp_path / "vllm").mkdir()
        (tmp_path / "vllm" / "__init__.py").write_text(vllm)
    if torch is not None:
        (tmp_path / "torch").mkdir()
        (tmp_path / "torch" / "__init__.py").write_text(
            f"__version__ = {torch!r}\nfrom torch import version\n"
        )
        (tmp_path / "torch" / "version.py").write_text(f"cuda = {cuda!r}\n")
    return subprocess.run(
        [sys.executable, "-S", "-c", GATE_CODE],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path)},
        check=False,
    )


def test_gate_prints_versions_and_cuda(tmp_path: Path) -> None:
    r = run_gate(tmp_path, "__version__ = '0.16.0'\n", "2.10.0", "13.0")
    assert r.returncode == 0, r.stderr
    assert parse_gate_output(r.stdout) == GateReport("0.16.0", "2.10.0", "13.0")


def test_gate_reports_a_cpu_torch_as_no_cuda(tmp_path: Path) -> None:
    r = run_gate(tmp_path, "__version__ = '0.16.0'\n", "2.10.0+cpu", None)
    assert parse_gate_output(r.stdout) == GateReport("0.16.0", "2.10.0+cpu", None)


def test_an_import_error_exits_3_with_the_traceback_on_stderr(tmp_path: Path) -> None:
    r = run_gate(
        tmp_path, "raise ImportError('vllm/_C.abi3.so: undefined symbol: x')\n", "2.10.0", "13.0"
    )
    assert r.returncode == IMPORT_FAILED_EXIT
    assert parse_gate_output(r.stdout) is None
    assert r.stderr.startswith("Traceback (most recent call last):")
    assert r.stderr.rstrip().endswith("ImportError: vllm/_C.abi3.so: undefined symbol: x")


def test_a_missing_torch_is_an_import_error_too(tmp_path: Path) -> None:
    r = run_gate(tmp_path, "__version__ = '0.16.0'\n", None, None)
    assert r.returncode == IMPORT_FAILED_EXIT
    assert "ModuleNotFoundError: No module named 'torch'" in r.stderr


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (
            "| NVIDIA-SMI 550.135                Driver Version: 550.135        CUDA Version: 12.4     |",  # noqa: E501 (a real capture, kept whole)
            "12.4",
        ),
        ("| NVIDIA-SMI 450.57       Driver Version: 450.57       CUDA Version: 11.0     |", "11.0"),
        (
            "| NVIDIA-SMI 610.43.02              KMD Version: 610.43.02     CUDA UMD Version: 13.3     |",  # noqa: E501 (a real capture, kept whole)
            "13.3",
        ),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", None),
        ("", None),
    ],
)
def test_driver_cuda_from_the_nvidia_smi_header(header: str, expected: str | None) -> None:
    text = f"Sun Jan 12 16:15:58 2025\n+{'-' * 20}+\n{header}\n+{'-' * 20}+\n"
    assert parse_driver_cuda(text) == expected


def test_the_simulated_nvidia_smi_header_parses_too() -> None:
    from bot.sim.tools.nvidia_smi import _table

    assert parse_driver_cuda(_table([], [], "12.8")) == "12.8"


@pytest.mark.parametrize(
    ("report", "target", "driver", "ok", "check", "says"),
    [
        (
            GateReport("0.16.0", "2.10.0", "13.0"),
            "0.16.0",
            "13.1",
            True,
            "all",
            "driver supports CUDA 13.1",
        ),
        (GateReport("0.16.0", "2.10.0", "13.0"), "0.16.0", "13.0", True, "all", "13.0"),
        (
            GateReport("0.16.0", "2.10.0", "13.0"),
            "0.16.0",
            "12.8",
            False,
            "CUDA",
            "built for CUDA 13.0, newer than the 12.8 the driver supports",
        ),
        # Issue 17 D2: a newer minor of the driver's major runs (CUDA minor-version
        # compatibility), with a warning; a newer major never does.
        (
            GateReport("0.16.0", "2.10.0", "12.10"),
            "0.16.0",
            "12.9",
            True,
            "all",
            "WARNING: torch's CUDA 12.10 is newer than the 12.9 the driver reports",
        ),
        (
            GateReport("0.16.0", "2.10.0+cu128", "12.8"),
            "0.16.0",
            "12.7",
            True,
            "all",
            "runs under CUDA minor-version compatibility",
        ),
        (
            GateReport("0.16.0", "2.10.0", "13.0"),
            "0.16.0",
            "12.9",
            False,
            "CUDA",
            "another major version",
        ),
        (GateReport("0.16.0", "2.10.0", "13"), "0.16.0", "12.9", False, "CUDA", "CUDA 13,"),
        (
            GateReport("0.15.1", "2.9.1", "12.8"),
            "0.16.0",
            "13.1",
            False,
            "vllm version",
            "vllm 0.15.1 is installed, not 0.16.0",
        ),
        # Issue 17 D3: vllm.__version__ has no local label, the resolved wheel has.
        (
            GateReport("0.16.0", "2.10.0", "13.0"),
            "0.16.0+cu129",
            "13.1",
            True,
            "all",
            "vllm 0.16.0, torch",
        ),
        (
            GateReport("0.16.0+cu126", "2.10.0", "13.0"),
            "0.16.0+cu129",
            "13.1",
            False,
            "vllm version",
            "vllm 0.16.0+cu126 is installed, not 0.16.0+cu129",
        ),
        (GateReport("0.16.0", "2.10.0+cpu", None), "0.16.0", "13.1", False, "CUDA", "CPU build"),
        (None, "0.16.0", "13.1", False, "import", "import vllm, torch failed"),
        # Good but unusual: the cu129 build on a 12.9 driver, a CUDA 13.0 torch on a
        # newer 13.x driver (R590 reports 13.1), the torch of the vllm-openai v0.30.0
        # image (2.13.0+cu130) on 13.0: all run, with no warning.
        (GateReport("0.31.0", "2.13.0+cu129", "12.9"), "0.31.0+cu129", "12.9", True, "all", "12.9"),
        (GateReport("0.31.0", "2.13.0", "13.0"), "0.31.0", "13.1", True, "all", "CUDA 13.1"),
        (GateReport("0.30.0", "2.13.0+cu130", "13.0"), "0.30.0", "13.0", True, "all", "13.0"),
        # Unknown is never "it runs": a driver whose CUDA cannot be read, a torch CUDA
        # that is no version.
        (
            GateReport("0.16.0", "2.10.0", "13.0"),
            None,
            None,
            False,
            "CUDA",
            "the driver's CUDA version is unknown",
        ),
        (
            GateReport("0.31.0", "2.13.0", "thirteen"),
            "0.31.0",
            "13.1",
            False,
            "CUDA",
            "cannot be compared",
        ),
    ],
)
def test_verdict(
    report: GateReport | None,
    target: str | None,
    driver: str | None,
    ok: bool,
    check: str,
    says: str,
) -> None:
    v = gate_verdict(report, target=target, driver_cuda=driver)
    assert (v.ok, v.check) == (ok, check)
    assert says in v.reason, v.reason
    # A warning only where torch's CUDA minor is newer than the driver's, on a pass.
    newer_minor = ok and report is not None and report.cuda in ("12.10", "12.8")
    assert (v.warning is not None) is newer_minor


# PyPI's default vLLM resolves a CUDA 13 torch (tests/samples/uv_dry_run_vllm_0.31.0_cuda13
# .txt: torch 2.13.0 pulls cuda-toolkit 13.0.3.0); a host whose driver is 12.x needs the
# cu129 build, which PyTorch serves at download.pytorch.org/whl/cu129 and vLLM at
# wheels.vllm.ai/<version>/cu129 (SOURCES.md: LMCache/LMCache PR #3400, docker/model-runner
# PR #921, vllm-project/vllm#43847).
CUDA13 = GateReport("0.31.0", "2.13.0", "13.0")


def test_a_cuda_13_torch_on_a_12_driver_names_pytorchs_cu129_index() -> None:
    v = gate_verdict(CUDA13, target="0.31.0", driver_cuda="12.9", indexes={})
    assert (v.ok, v.check) == (False, "CUDA")
    assert "built for CUDA 13.0, newer than the 12.9 the driver supports" in v.reason
    assert "the cu129 build (CUDA 12.9) runs on this driver" in v.reason
    assert "https://download.pytorch.org/whl/cu129" in v.reason
    assert "`indexes`" in v.reason and "--index <name>" in v.reason


@pytest.mark.parametrize(
    "url",
    [
        "https://download.pytorch.org/whl/cu129",
        "https://wheels.vllm.ai/0.31.0/cu129/",
        "https://mirror:s3cret-token@pypi.internal.example/whl/CU129/simple",
    ],
)
def test_a_configured_cu129_index_is_named_not_its_url(url: str) -> None:
    indexes = {"pypi-mirror": "https://pypi.internal.example/simple", "cuda12": url}
    v = gate_verdict(CUDA13, target="0.31.0", driver_cuda="12.8", indexes=indexes)
    assert not v.ok
    assert "the configured index `cuda12` serves it: redeploy with `--index cuda12`" in v.reason
    assert url not in v.reason and "s3cret" not in v.reason  # a URL may hold a credential


def test_an_index_of_another_build_is_not_taken_for_the_cu129_one() -> None:
    indexes = {"cu130": "https://download.pytorch.org/whl/cu130", "x": "https://h/cu1290/"}
    v = gate_verdict(CUDA13, target="0.31.0", driver_cuda="12.4", indexes=indexes)
    assert "--index cu130" not in v.reason and "--index x" not in v.reason
    assert "https://download.pytorch.org/whl/cu129" in v.reason


def test_a_driver_older_than_any_build_we_know_says_so_without_an_index() -> None:
    v = gate_verdict(CUDA13, target="0.31.0", driver_cuda="10.2", indexes={})
    assert not v.ok and v.reason.endswith("this driver needs a torch built for CUDA 10.x")
