"""The simulated host's Python environment: what each vLLM release pulls in, which wheels
the index serves, what uv's cache holds, and how long a wheel takes to download.

The shapes follow real vLLM upgrades. The host boots with a CUDA 12.9 build (torch
``2.12.1+cu129`` and the ``-cu12`` CUDA wheels, as PyTorch's cu129 index serves them);
the newest release, 0.31.0, comes from PyPI as its CUDA 13 build (torch 2.13.0 with
``cuda-toolkit`` 13.0.3.0 and the unsuffixed ``nvidia-*`` wheels: the real dry run in
tests/samples/uv_dry_run_vllm_0.31.0_cuda13.txt, whose versions the 0.31.0 set uses). So
the upgrade changes torch, triton, flashinfer, transformers and the CUDA wheels (the
``-cu12`` ones are left behind by ``uv pip install``, which never removes a package, and
``-cu13`` ones come in), and adds a package (``cuda-toolkit``). Sizes are those of the
real wheels, rounded.

Other builds a real index serves. An index whose URL is a cu129 one (a path segment
``cu129``: PyTorch's download.pytorch.org/whl/cu129, vLLM's wheels.vllm.ai/<version>/cu129)
serves the newest release's cu129 build: ``vllm==0.31.0+cu129`` with torch
``2.13.0+cu129``. With ``cu129_on_cuda_12_8`` the host's own index resolves that build
too, on a driver that reports CUDA 12.8 (minor-version compatibility). With
``cu129_wheels`` vLLM comes only as wheels labelled ``+cu129``: vLLM's ``setup.py``
(``get_vllm_version``) writes ``vllm/_version.py`` before it appends that label to the
wheel's version, so ``vllm.__version__`` and ``/version`` lack it (``module_version``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from bot.sim.state import DEFAULT_VERSION, HostState

PACKAGE = "vllm"

# Every release needs these, at these versions (those of the real 0.31.0 resolution).
BASE: dict[str, str] = {
    "aiohttp": "3.14.5",
    "anyio": "4.16.0",
    "blake3": "1.0.11",
    "cachetools": "8.0.3",
    "cloudpickle": "3.1.3",
    "compressed-tensors": "0.17.0",
    "einops": "0.8.2",
    "fastapi": "0.136.3",
    "filelock": "4.3.2",
    "huggingface-hub": "1.33.0",
    "jinja2": "3.1.6",
    "msgspec": "0.23.0",
    "ninja": "1.13.2",
    "numpy": "2.3.5",
    "openai": "3.63.0",
    "pillow": "13.0.0",
    "prometheus-client": "0.26.0",
    "protobuf": "7.36.2",
    "psutil": "7.2.2",
    "pydantic": "2.14.4",
    "pyyaml": "6.0.4",
    "pyzmq": "27.3.0",
    "regex": "2026.12.2",
    "requests": "2.34.2",
    "safetensors": "0.8.0",
    "sentencepiece": "0.2.3",
    "tiktoken": "0.14.0",
    "tokenizers": "0.23.3",
    "tqdm": "4.70.1",
    "uvicorn": "0.55.0",
    "xgrammar": "0.2.7",
}
# A CUDA 12.9 build, as PyTorch's cu129 index serves torch (the -cu12 CUDA wheels).
_CU129: dict[str, str] = {
    "torch": "2.12.1+cu129",
    "torchvision": "0.27.1+cu129",
    "torchaudio": "2.11.0+cu129",
    "triton": "3.6.0",
    "flashinfer-python": "0.6.18",
    "transformers": "5.14.0",
    "nvidia-cublas-cu12": "12.9.1.4",
    "nvidia-cuda-runtime-cu12": "12.9.79",
    "nvidia-cudnn-cu12": "9.10.2.21",
    "nvidia-nccl-cu12": "2.27.5",
    "nvidia-cusparse-cu12": "12.5.10.65",
}
# PyPI's default build of vLLM 0.31.0: CUDA 13 (uv_dry_run_vllm_0.31.0_cuda13.txt).
_CU130: dict[str, str] = {
    "torch": "2.13.0",
    "torchvision": "0.28.0",
    "torchaudio": "2.11.0",
    "triton": "3.7.1",
    "flashinfer-python": "0.7.0.post1",
    "transformers": "5.17.0",
    "cuda-toolkit": "13.0.3.0",
    "nvidia-cublas": "13.1.1.3",
    "nvidia-cuda-runtime": "13.0.96",
    "nvidia-cudnn-cu13": "9.20.0.48",
    "nvidia-nccl-cu13": "2.29.7",
    "nvidia-cusparse": "12.6.3.3",
}
# vLLM version -> the packages it pulls in (BASE included). A version not listed pulls in
# the newest release's set.
RELEASES: dict[str, dict[str, str]] = {
    "0.30.0": {**BASE, **_CU129},
    DEFAULT_VERSION: {**BASE, **_CU129, "transformers": "5.16.0"},
    "0.31.0": {**BASE, **_CU130},
}
NEWEST = "0.31.0"
# The newest release built for CUDA 12.9 (a cu129 index; cu129_on_cuda_12_8).
CU129_NEWEST: dict[str, str] = {
    **BASE,
    **_CU129,
    "torch": "2.13.0+cu129",
    "torchvision": "0.28.0+cu129",
    "torchaudio": "2.11.0+cu129",
    "triton": "3.7.1",
    "flashinfer-python": "0.7.0.post1",
    "transformers": "5.17.0",
}
# torch version -> torch.version.cuda of its wheel.
TORCH_CUDA: dict[str, str] = {"2.12.1+cu129": "12.9", "2.13.0": "13.0", "2.13.0+cu129": "12.9"}
# The driver cu129_on_cuda_12_8 gives the host (R570 drivers report 12.8).
DRIVER_12_8 = "12.8"
# The label of a CUDA 12.9 build: on vLLM's wheels (cu129_wheels, a cu129 index) and on the
# path of an index that serves that build. Every label vLLM's setup.py appends to a
# wheel's version only (never to vllm/_version.py) is dropped by module_version.
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
}
SMALL_MIB = 0.4


def deps_of(version: str) -> dict[str, str]:
    return dict(RELEASES.get(module_version(version), RELEASES[NEWEST]))


def cu129_index(indexes: Sequence[str]) -> bool:
    """Whether one of the indexes uv was given is a cu129 one (a path segment ``cu129``)."""
    return any(CU129 in urlsplit(u).path.lower().split("/") for u in indexes)


def cu129_build(st: HostState, indexes: Sequence[str]) -> bool:
    """Whether the newest release resolves as its cu129 build here."""
    return st.faults.cu129_on_cuda_12_8 or cu129_index(indexes)


def release(st: HostState, version: str, indexes: Sequence[str] = ()) -> dict[str, str]:
    """What installing vllm ``version`` pulls in on this host's index (and ``indexes``)."""
    if cu129_build(st, indexes) and module_version(version) == NEWEST:
        return dict(CU129_NEWEST)
    return deps_of(version)


def module_version(wheel: str) -> str:
    """What ``vllm.__version__`` (and so ``/version``) says for the wheel ``wheel``: its
    version without the build label setup.py appended (``0.31.0+cu129`` -> ``0.31.0``,
    ``...dev313+g662205d34.cu129`` -> ``...dev313+g662205d34``)."""
    return _BUILD_LABEL.sub("", wheel)


def wheel_of(st: HostState, version: str, indexes: Sequence[str] = ()) -> str:
    """The wheel a vllm ``version`` resolves to: with cu129_wheels, or the newest release
    from a cu129 index, the labelled build (PEP 440: ``==0.31.0`` matches
    ``0.31.0+cu129``)."""
    labelled = st.faults.cu129_wheels or (cu129_index(indexes) and version == NEWEST)
    if not labelled or module_version(version) != version:
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
        # With cu129_wheels the index has the labelled builds only; a cu129 index, the
        # newest release's cu129 build beside the rest.
        labelled = [wheel_of(st, v, indexes) for v in versions]
        plain = versions if cu129_index(indexes) and not st.faults.cu129_wheels else []
        return version in labelled + plain
    if st.faults.index_drops_old:
        return release(st, st.config.latest_version, indexes).get(name) == version
    return any(r.get(name) == version for r in (*RELEASES.values(), CU129_NEWEST))


def driver_cuda(st: HostState) -> str:
    """The CUDA version the driver supports (torch_cuda_mismatch: an older driver;
    cu129_on_cuda_12_8: one that reports 12.8)."""
    if st.faults.torch_cuda_mismatch:
        return st.config.old_driver_cuda
    return DRIVER_12_8 if st.faults.cu129_on_cuda_12_8 else st.config.driver_cuda


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
