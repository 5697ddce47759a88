"""bot.core.versions (issue 17 D3): the installed wheel, the version asked for, and what
the server and ``vllm.__version__`` say, judged as one release or two builds.

vLLM's ``setup.py`` (``get_vllm_version``, vllm-project/vllm) writes ``vllm/_version.py``
and then appends ``+cu129`` (``.cu129`` after a dev build's ``+g<commit>``; also
``+precompiled``, ``+rocm...``) to the wheel's version only, so the wheel's metadata and
the package's own version differ by that label (wheels named so: vllm-project/vllm#43847
``vllm-0.21.0+cu129-cp38-abi3-...whl``, vllm-project/recipes#66
``vllm-0.10.2rc3.dev371%2Bgb215ed849.cu129-...whl``). The flows are driven by hand-made
outcomes (tests/test_sequence.py's ``Host``)."""

from __future__ import annotations

import pytest

from bot.core.flows import EndStep
from bot.core.plan import Step
from bot.core.versions import cuda_label, cuda_of_label, same_build, same_release
from tests.test_sequence import Host, run


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("0.11.0", "0.11.0+cu129", True),  # the wheel's label, the package's none
        ("0.11.0+cu126", "0.11.0", True),
        ("0.11.0+precompiled", "0.11.0", True),
        ("0.16.0rc2.dev313+g662205d34", "0.16.0rc2.dev313+g662205d34.cu129", True),
        ("0.16.0", "0.16", True),  # PEP 440 normalised
        ("0.11.0+CU129", "0.11.0+cu129", True),
        ("0.11.0+cu129", "0.11.0+cu126", False),  # two builds of one release
        ("0.16.0rc2.dev313+g662205d34", "0.16.0rc2.dev313+g0000000000.cu129", False),
        ("0.11.0", "0.11.1+cu129", False),
        ("0.11.0", "0.11.0.post1", False),
        ("not-a-version", "not-a-version", True),  # text: only itself
        ("not-a-version", "0.11.0", False),
        (None, "0.11.0", False),  # unknown is never a match
        (None, None, False),
    ],
)
def test_same_release(a: str | None, b: str | None, same: bool) -> None:
    assert same_release(a, b) is same
    assert same_release(b, a) is same


@pytest.mark.parametrize(
    ("version", "cuda"),
    [
        ("2.13.0+cu129", "12.9"),  # PyTorch's cu129 index (download.pytorch.org/whl/cu129)
        ("2.13.0+cu130", "13.0"),  # the vllm-openai v0.30.0 image's torch (SOURCES.md)
        ("2.7.1+cu128", "12.8"),  # astral-sh/uv#15446
        ("2.0.1+cu118", "11.8"),
        ("0.31.0rc2.dev313+g662205d34.cu129", "12.9"),  # a dev build: after +g<commit>
        ("0.31.0+CU129", "12.9"),
        ("2.13.0", None),  # PyPI's wheel: no label (its CUDA wheels say, bot.core.cuda)
        ("2.13.0+cpu", None),
        ("2.13.0+rocm7.0", None),
        ("2.13.0+cu12", None),  # no such index: not guessed
        ("2.13.0+cu1290", None),
        ("not-a-version+cu129", None),
    ],
)
def test_the_cuda_a_label_names(version: str, cuda: str | None) -> None:
    assert cuda_of_label(version) == cuda
    if cuda is not None:
        assert cuda_label(cuda) == f"cu{cuda.replace('.', '')}"


def test_a_change_list_still_tells_the_builds_apart() -> None:
    assert not same_build("0.11.0", "0.11.0+cu129")
    assert same_build("0.16", "0.16.0") and same_build("x", "x") and not same_build("x", "y")


def _end(h: Host, step: Step) -> EndStep:
    return next(n for n in h.notices if isinstance(n, EndStep) and n.step == step)


def test_readiness_takes_the_unlabelled_version_for_the_installed_cu129_wheel() -> None:
    h = Host(
        installed_after="0.16.0+cu129",
        version_answer=(200, '{"version":"0.16.0"}'),
        gate_stdout='chatops-gate {"vllm": "0.16.0", "torch": "2.10.0", "cuda": "13.0"}\n',
    )
    out = run(h, version="0.16.0+cu129")
    assert out.status == "succeeded", out.summary
    assert h.version == "0.16.0+cu129"
    assert _end(h, Step.READINESS).detail.endswith(
        "reports 0.16.0, the release of the installed 0.16.0+cu129"
    )


def test_another_build_of_the_same_release_is_not_the_installed_one() -> None:
    # A server still running (or reporting) the cu126 build is not the cu129 one installed.
    h = Host(
        installed_after="0.16.0+cu129",
        version_answer=(200, '{"version":"0.16.0+cu126"}'),
        gate_stdout='chatops-gate {"vllm": "0.16.0", "torch": "2.10.0", "cuda": "13.0"}\n',
    )
    out = run(h, version="0.16.0+cu129")
    # (This host's /version never changes, so the restored build is not ready either.)
    assert out.status == "failed", out.summary
    assert out.summary.startswith("not ready: ")
    assert (
        "the server reports version 0.16.0+cu126, but vllm 0.16.0+cu129 is installed" in out.summary
    )


def test_latest_resolving_to_a_labelled_wheel_passes_the_gate_and_its_twin_does_not() -> None:
    # Unpinned, the target is the dry run's `+ vllm==0.16.0+cu129`; the gate's interpreter
    # says 0.16.0 (no label): one release. One that says another build is refused.
    gate = 'chatops-gate {"vllm": "%s", "torch": "2.10.0", "cuda": "13.0"}\n'
    h = Host(installed_after="0.16.0+cu129", gate_stdout=gate % "0.16.0")
    assert run(h).status == "succeeded"
    h = Host(installed_after="0.16.0+cu129", gate_stdout=gate % "0.16.0+cu126")
    out = run(h)
    assert out.status == "rolled_back"
    assert (
        "vllm version check failed: vllm 0.16.0+cu126 is installed, not 0.16.0+cu129" in out.summary
    )
