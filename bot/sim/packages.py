"""The simulated host's Python environment: what each vLLM release pulls in, which wheels
the index serves, what uv's cache holds, and how long a wheel takes to download.

The shapes follow real vLLM upgrades (issue 10): moving from a CUDA 12.8 build to the
0.16.0 release changes torch (2.9.1 -> 2.10.0, built for CUDA 13.0), triton, flashinfer,
transformers and the ``nvidia-*`` CUDA wheels (the ``-cu12`` ones are left behind by
``uv pip install``, which never removes a package, and ``-cu13`` ones come in), and adds
a package. Sizes are those of the real wheels, rounded; the changed wheels of that
upgrade come to about 4 GiB.

Issue 17 adds two builds a real index serves. With ``cu128_on_cuda_12_7`` the new
release comes as a cu128 build (torch ``2.10.0+cu128`` from PyTorch's cu128 index, the
``-cu12`` CUDA wheels) on a driver that reports CUDA 12.7. With ``cu129_wheels`` vLLM
comes only as wheels labelled ``+cu129``: vLLM's ``setup.py`` (``get_vllm_version``)
writes ``vllm/_version.py`` before it appends that label to the wheel's version, so
``vllm.__version__`` and ``/version`` lack it (``module_version``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from bot.sim.state import DEFAULT_VERSION, HostState

PACKAGE = "vllm"

# Every release needs these, at these versions.
BASE: dict[str, str] = {
    "aiohttp": "3.13.2",
    "anyio": "4.11.0",
    "blake3": "1.0.8",
    "cachetools": "6.2.1",
    "cloudpickle": "3.1.2",
    "compressed-tensors": "0.12.2",
    "einops": "0.8.1",
    "fastapi": "0.121.1",
    "filelock": "3.20.0",
    "huggingface-hub": "0.36.0",
    "jinja2": "3.1.6",
    "msgspec": "0.19.0",
    "ninja": "1.13.0",
    "numpy": "2.2.6",
    "openai": "2.7.1",
    "pillow": "12.0.0",
    "prometheus-client": "0.23.1",
    "protobuf": "6.33.0",
    "psutil": "7.1.3",
    "pydantic": "2.12.4",
    "pyyaml": "6.0.3",
    "pyzmq": "27.1.0",
    "regex": "2025.11.3",
    "requests": "2.32.5",
    "safetensors": "0.6.2",
    "sentencepiece": "0.2.1",
    "tiktoken": "0.12.0",
    "tokenizers": "0.22.1",
    "tqdm": "4.67.1",
    "uvicorn": "0.38.0",
    "xgrammar": "0.1.25",
}
_CU128: dict[str, str] = {
    "torch": "2.9.1",
    "torchvision": "0.24.1",
    "torchaudio": "2.9.1",
    "triton": "3.5.1",
    "flashinfer-python": "0.5.2",
    "transformers": "4.57.1",
    "nvidia-cublas-cu12": "12.8.4.1",
    "nvidia-cuda-runtime-cu12": "12.8.90",
    "nvidia-cudnn-cu12": "9.10.2.21",
    "nvidia-nccl-cu12": "2.27.5",
    "nvidia-cusparse-cu12": "12.5.8.93",
}
_CU130: dict[str, str] = {
    "torch": "2.10.0",
    "torchvision": "0.25.0",
    "torchaudio": "2.10.0",
    "triton": "3.6.0",
    "flashinfer-python": "0.6.1",
    "transformers": "4.57.6",
    "nvidia-cublas": "13.1.0.3",
    "nvidia-cuda-runtime": "13.0.96",
    "nvidia-cudnn-cu13": "9.15.1.9",
    "nvidia-nccl-cu13": "2.28.9",
    "nvidia-cusparse": "12.6.3.3",
    "orjson": "3.11.4",
}
# vLLM version -> the packages it pulls in (BASE included). A version not listed pulls in
# the newest release's set.
RELEASES: dict[str, dict[str, str]] = {
    "0.15.1": {**BASE, **_CU128},
    DEFAULT_VERSION: {**BASE, **_CU128, "transformers": "4.57.3"},
    "0.16.0": {**BASE, **_CU130},
}
NEWEST = "0.16.0"
# The newest release built for CUDA 12.8 (cu128_on_cuda_12_7).
CU128_NEWEST: dict[str, str] = {
    **BASE,
    **_CU128,
    "torch": "2.10.0+cu128",
    "torchvision": "0.25.0+cu128",
    "torchaudio": "2.10.0+cu128",
    "triton": "3.6.0",
    "flashinfer-python": "0.6.1",
    "transformers": "4.57.6",
    "orjson": "3.11.4",
}
# torch version -> torch.version.cuda of its wheel.
TORCH_CUDA: dict[str, str] = {"2.9.1": "12.8", "2.10.0": "13.0", "2.10.0+cu128": "12.8"}
# The driver cu128_on_cuda_12_7 gives the host (an 8x L40S host on R565 reports 12.7).
DRIVER_12_7 = "12.7"
# The label cu129_wheels puts on vLLM's wheels, and every label vLLM's setup.py appends
# to a wheel's version only (never to vllm/_version.py).
CU129 = "cu129"
# What duplicate_dist_info leaves in the venv: two dist-infos of pip, as uv's own test
# (freeze_duplicate) and tests/samples/uv_pip_freeze_duplicate_dist_info.txt have them.
DUPLICATE_PINS = ("pip==21.3.1", "pip==22.1.1")
_BUILD_LABEL = re.compile(r"[+.](?:cu[0-9]+|rocm[0-9]+|precompiled|cpu|xpu|tpu|empty)$")
# Wheel sizes in MiB; anything not listed is a small pure-Python wheel.
SIZE_MIB: dict[str, float] = {
    "torch": 880.0,
    "vllm": 420.0,
    "nvidia-cudnn-cu12": 674.0,
    "nvidia-cudnn-cu13": 690.0,
    "nvidia-cublas-cu12": 566.0,
    "nvidia-cublas": 520.0,
    "nvidia-nccl-cu12": 306.0,
    "nvidia-nccl-cu13": 290.0,
    "triton": 160.0,
    "flashinfer-python": 420.0,
    "nvidia-cusparse-cu12": 275.0,
    "nvidia-cusparse": 260.0,
    "torchvision": 8.0,
    "torchaudio": 4.0,
    "transformers": 11.5,
    "nvidia-cuda-runtime-cu12": 0.9,
    "nvidia-cuda-runtime": 2.2,
    "numpy": 16.0,
    "pillow": 6.5,
    "orjson": 0.9,
}
SMALL_MIB = 0.4


def deps_of(version: str) -> dict[str, str]:
    return dict(RELEASES.get(module_version(version), RELEASES[NEWEST]))


def release(st: HostState, version: str) -> dict[str, str]:
    """What installing vllm ``version`` pulls in on this host's index."""
    if st.faults.cu128_on_cuda_12_7 and module_version(version) == NEWEST:
        return dict(CU128_NEWEST)
    return deps_of(version)


def module_version(wheel: str) -> str:
    """What ``vllm.__version__`` (and so ``/version``) says for the wheel ``wheel``: its
    version without the build label setup.py appended (``0.16.0+cu129`` -> ``0.16.0``,
    ``...dev313+g662205d34.cu129`` -> ``...dev313+g662205d34``)."""
    return _BUILD_LABEL.sub("", wheel)


def wheel_of(st: HostState, version: str) -> str:
    """The wheel a vllm ``version`` resolves to: with cu129_wheels, the labelled build
    (PEP 440: ``==0.16.0`` matches ``0.16.0+cu129``)."""
    if not st.faults.cu129_wheels or module_version(version) != version:
        return version
    return f"{version}{'.' if '+' in version else '+'}{CU129}"


def environment(st: HostState) -> dict[str, str]:
    """Every installed package and its version (vllm included when installed)."""
    env = dict(st.packages)
    if st.installed_version is not None:
        env[PACKAGE] = st.installed_version
    return env


def pin(name: str, version: str) -> str:
    return f"{name}=={version}"


def size_mib(name: str) -> float:
    return SIZE_MIB.get(name, SMALL_MIB)


def served(st: HostState, name: str, version: str, indexes: list[str]) -> bool:
    """Whether the index uv was given serves this wheel. With index_drops_old, only the
    newest release's wheels are left (a nightly index keeps a few days of builds)."""
    if name == PACKAGE:
        versions = list(st.config.available_versions)
        if st.config.index_url and st.config.index_url in indexes:
            versions += st.config.index_versions
        if st.faults.index_drops_old:
            versions = [v for v in versions if v == st.config.latest_version]
        # With cu129_wheels the index has the labelled builds only.
        return version in [wheel_of(st, v) for v in versions]
    if st.faults.index_drops_old:
        return release(st, st.config.latest_version).get(name) == version
    return any(r.get(name) == version for r in (*RELEASES.values(), release(st, NEWEST)))


def driver_cuda(st: HostState) -> str:
    """The CUDA version the driver supports (torch_cuda_mismatch: an older driver;
    cu128_on_cuda_12_7: one that reports 12.7)."""
    if st.faults.torch_cuda_mismatch:
        return st.config.old_driver_cuda
    return DRIVER_12_7 if st.faults.cu128_on_cuda_12_7 else st.config.driver_cuda


def import_problem(
    st: HostState, env: Mapping[str, str] | None = None, *, throwaway: bool = False
) -> str | None:
    """Why `import vllm, torch` fails in this environment, as Python would say it; None
    when it imports. ``throwaway``: the prefetch's venv, which lacks what the install
    leaves alone in the service's venv (the stale_plugin fault's plugin)."""
    env = environment(st) if env is None else env
    if PACKAGE not in env:
        return "ModuleNotFoundError: No module named 'vllm'"
    if "torch" not in env:
        return "ModuleNotFoundError: No module named 'torch'"
    broken = st.faults.import_error or (st.faults.stale_plugin and not throwaway)
    if broken and env[PACKAGE] != st.boot_version:
        return (
            f"ImportError: {st.venv}/lib/python3.12/site-packages/vllm/_C.abi3.so: "
            "undefined symbol: _ZN3c104cuda9SetDeviceEab"
        )
    return None


def cuda_problem(st: HostState) -> str | None:
    """Why torch cannot use the GPUs on this driver; None when it can. A newer CUDA
    minor of the driver's major runs (minor-version compatibility); a newer major not."""
    env = environment(st)
    built = TORCH_CUDA.get(env.get("torch", ""))
    if built is None:
        return None

    def major(v: str) -> int:
        return int(v.split(".")[0])

    if major(built) > major(driver_cuda(st)):
        return (
            "RuntimeError: The NVIDIA driver on your system is too old (found version "
            f"{driver_cuda(st).replace('.', '0')}0)."
        )
    return None
