"""bot.core.packages: uv's install reports and freezes, parsed on real captured output.

Every sample here is real uv 0.13.9 output from tests/samples (see SOURCES.md there):
a vLLM 0.32.0 -> 0.33.0 upgrade that also moves torch 2.13.0 -> 2.14.0, its dry run,
and the freezes before and after it; and what PyPI resolves for vLLM 0.31.0 into an empty
venv (torch 2.13.0, a CUDA 13 build: ``cuda-toolkit==13.0.3.0``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.packages import (
    BUILD_PREFIX,
    Change,
    Entry,
    PackageDiff,
    diff_freezes,
    downloaded_bytes,
    highlighted,
    parse_entry,
    parse_freeze,
    parse_install_changes,
    parse_install_set,
    planned_diff,
)
from bot.core.redact import Redactor
from bot.core.remote import parse_resolved_version

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


TORCH_CHANGE = (  # what uv_dry_run_torch_change.txt lists, in uv's order
    Change("flashinfer-python", "0.7.0.post1", "0.7.2.post1"),
    Change("humming-kernels", "0.1.17", "0.1.19"),
    Change("nvidia-cudnn-cu13", "9.20.0.48", "9.24.0.43"),
    Change("nvidia-nccl-cu13", "2.29.7", "2.30.7"),
    Change("orjson", None, "3.13.0"),
    Change("tokenspeed-mla", "0.2.15", "2.0.3"),
    Change("torch", "2.13.0", "2.14.0"),
    Change("torchvision", "0.28.0", "0.29.0"),
    Change("triton", "3.7.1", "3.8.0"),
    Change("vllm", "0.32.0", "0.33.0"),
)


def test_dry_run_of_a_vllm_upgrade_lists_the_torch_change() -> None:
    # uv_dry_run_torch_change.txt: `uv pip install --dry-run vllm==0.33.0` (stderr and
    # stdout merged; uv prints the change on stderr).
    assert parse_install_changes(sample("uv_dry_run_torch_change.txt")) == TORCH_CHANGE


def test_the_real_install_reports_the_same_change_as_its_dry_run() -> None:
    # uv_pip_install_upgrade_torch_change.txt: the install that the dry run above planned.
    assert parse_install_changes(sample("uv_pip_install_upgrade_torch_change.txt")) == TORCH_CHANGE


@pytest.mark.parametrize(
    "name",
    [
        "uv_dry_run_no_change.txt",
        "uv_pip_install_already_satisfied.txt",
        "uv_dry_run_unsatisfiable.txt",
    ],
)
def test_outputs_without_a_change_list_change_nothing(name: str) -> None:
    assert parse_install_changes(sample(name)) == ()


def test_small_dry_run_with_one_upgrade_and_one_new_package() -> None:
    # uv_small_dry_run_upgrade.txt: `uv pip install --dry-run packaging==24.1 six`.
    assert parse_install_changes(sample("uv_small_dry_run_upgrade.txt")) == (
        Change("packaging", "23.2", "24.1"),
        Change("six", None, "1.17.0"),
    )


def test_a_reinstall_at_the_same_version_is_no_change() -> None:
    # uv prints `~ name==version` for a package --reinstall put back as it was.
    text = " ~ numpy==2.2.6\n - torch==2.9.1\n + torch==2.10.0\n - gone==1.0\n"
    assert parse_install_changes(text) == (
        Change("torch", "2.9.1", "2.10.0"),
        Change("gone", "1.0", None),
    )


def test_download_size_is_the_sum_of_the_downloading_lines() -> None:
    # uv_pip_install_upgrade_torch_change.txt: vllm 320.8, torch 528.9, triton 236.5,
    # cudnn 527.5, flashinfer 59.2, nccl 206.0, torchvision 7.1 MiB.
    total = downloaded_bytes(sample("uv_pip_install_upgrade_torch_change.txt"))
    assert total == round((320.8 + 528.9 + 236.5 + 527.5 + 59.2 + 206.0 + 7.1) * 1024**2)
    assert downloaded_bytes(sample("uv_dry_run_torch_change.txt")) is None


def test_freeze_parses_every_pin_of_a_real_vllm_environment() -> None:
    # uv_pip_freeze_vllm_0.32.0.txt: `uv pip freeze` stdout, 197 lines.
    before = parse_freeze(sample("uv_pip_freeze_vllm_0.32.0.txt"))
    assert before.count == len(before.versions) == 197 and before.others == ()
    assert before.version_of("torch") == "2.13.0" and before.version_of("vLLM") == "0.32.0"
    assert before.version_of("nvidia_cudnn_cu13") == "9.20.0.48"  # names are canonical


def test_freezes_before_and_after_the_upgrade_differ_as_uv_said() -> None:
    before = parse_freeze(sample("uv_pip_freeze_vllm_0.32.0.txt"))
    after = parse_freeze(sample("uv_pip_freeze_vllm_0.33.0.txt"))
    diff = diff_freezes(before, after)
    assert sorted(diff.changes, key=lambda c: c.name) == sorted(TORCH_CHANGE, key=lambda c: c.name)
    assert diff.unchanged == 197 - 9  # nine packages moved, one (orjson) is new
    assert diff.build == "torch 2.14.0 (CUDA 13.0, from cuda-toolkit 13.0.3.0)"
    same = diff_freezes(before, before)
    assert (same.changes, same.unchanged) == ((), 197)
    assert same.lines()[0] == "  no package changes version"  # and no build line then


def test_the_dry_runs_pinned_set_is_the_freeze_after_the_install() -> None:
    # What the prefetch fetches: the snapshot with the dry run's changes applied.
    before = parse_freeze(sample("uv_pip_freeze_vllm_0.32.0.txt"))
    after = parse_freeze(sample("uv_pip_freeze_vllm_0.33.0.txt"))
    planned = before.applied(TORCH_CHANGE)
    assert dict(planned.versions) == dict(after.versions)
    assert planned.requirements().count("\n") == 198


def test_freeze_with_stderr_merged_in_keeps_the_using_python_line_apart() -> None:
    # uv_small_freeze.txt was captured with 2>&1: its first line is uv's stderr.
    frozen = parse_freeze(sample("uv_small_freeze.txt"))
    assert dict(frozen.versions) == {"packaging": "24.1", "six": "1.17.0"}
    assert frozen.others == ("Using Python 3.11.7 environment at: venv",)


def test_local_entries_are_compared_as_text() -> None:
    before = parse_freeze("a==1\n-e file:///src/plugin\n")
    after = parse_freeze("a==1\nplugin @ file:///src/plugin-2\n")
    diff = diff_freezes(before, after)
    assert [c.describe() for c in diff.changes] == [
        "-e file:///src/plugin (removed)",
        "plugin @ file:///src/plugin-2 (new)",
    ]
    assert diff.unchanged == 1
    assert before.digest != after.digest and len(before.digest) == 64


def test_highlights_and_lines_for_the_card() -> None:
    before = parse_freeze(sample("uv_pip_freeze_vllm_0.32.0.txt"))
    diff = planned_diff(before, TORCH_CHANGE)
    assert diff.unchanged == 197 - 9
    assert [c.name for c in diff.highlights] == [
        "flashinfer-python",
        "nvidia-cudnn-cu13",
        "nvidia-nccl-cu13",
        "torch",
        "torchvision",
        "triton",
        "vllm",
    ]
    lines = diff.lines()
    # torch and vllm first, then the rest of the CUDA stack, then everything else.
    assert lines[:3] == [
        "! torch 2.13.0 → 2.14.0",
        "! vllm 0.32.0 → 0.33.0",
        "! flashinfer-python 0.7.0.post1 → 0.7.2.post1",
    ]
    assert "  orjson (new) 3.13.0" in lines and lines.index("  orjson (new) 3.13.0") > 6
    # torch 2.14.0's CUDA from the cuda-toolkit the upgrade leaves as it was.
    assert lines[-2:] == [
        f"  {BUILD_PREFIX}torch 2.14.0 (CUDA 13.0, from cuda-toolkit 13.0.3.0)",
        "  188 other packages unchanged",
    ]
    assert diff.lines(limit=2)[2] == "  … and 8 more"
    assert diff.headline() == (
        "torch 2.13.0 → 2.14.0, vllm 0.32.0 → 0.33.0, "
        "flashinfer-python 0.7.0.post1 → 0.7.2.post1 and 7 more"
    )
    assert PackageDiff.from_json(diff.to_json()) == diff


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("torch", True),
        ("Torch", True),
        ("triton", True),
        ("transformers", True),
        ("flashinfer-python", True),
        ("nvidia-cuda-runtime", True),
        ("nvidia_nccl_cu13", True),
        ("cupy-cuda12x", True),
        ("numpy", False),
        ("orjson", False),
        ("fastapi", False),
    ],
)
def test_what_is_highlighted(name: str, expected: bool) -> None:
    assert highlighted(name) is expected


def test_what_the_install_installs_is_every_plus_and_tilde_line() -> None:
    # uv_dry_run_torch_change.txt: without --force-reinstall, only the ten moved ones.
    installs = parse_install_set(sample("uv_dry_run_torch_change.txt"))
    assert installs == {c.name: f"{c.name}=={c.after}" for c in TORCH_CHANGE}
    assert parse_install_set(" ~ numpy==2.2.6\n - torch==2.9.1\n + torch==2.10.0\n") == {
        "numpy": "numpy==2.2.6",
        "torch": "torch==2.10.0",
    }


# ---- issue 17 D7: a freeze listing one package twice ----------------------------------------


def test_a_freeze_listing_pip_twice_is_not_restorable() -> None:
    # uv_pip_freeze_duplicate_dist_info.txt: real uv 0.13.9, a venv with pip-21.3.1 and a
    # copied pip-22.1.1.dist-info (uv's own freeze_duplicate test, astral-sh/uv
    # crates/uv/tests/it/pip_freeze.rs). uv_pip_sync_duplicate_pins.txt: `uv pip sync` of
    # that very freeze fails to resolve, so a rollback to it could never work.
    frozen = parse_freeze(sample("uv_pip_freeze_duplicate_dist_info.txt"))
    assert frozen.text == "pip==21.3.1\npip==22.1.1\n"  # the snapshot keeps both lines
    assert frozen.duplicates == {"pip": ("21.3.1", "22.1.1")}
    assert frozen.unrestorable() == "two versions of pip installed (21.3.1, 22.1.1)"
    assert "you require pip==21.3.1 and pip==22.1.1" in sample("uv_pip_sync_duplicate_pins.txt")


def test_the_same_pin_twice_is_restorable_but_two_spellings_of_one_name_are_not() -> None:
    # uv resolves `pip==21.3.1` given twice (checked with uv 0.13.9 `pip sync --dry-run`):
    # a good if odd freeze. Two spellings of one name are one package at two versions, and
    # a pin beside a URL entry of the same package is two builds: neither is restorable.
    assert parse_freeze("pip==21.3.1\npip==21.3.1\nsix==1.17.0\n").unrestorable() is None
    assert parse_freeze(sample("uv_pip_freeze_vllm_0.32.0.txt")).unrestorable() is None
    assert parse_freeze("Foo_Bar==1.0\nfoo-bar==2.0\n").unrestorable() == (
        "two versions of foo-bar installed (1.0, 2.0)"
    )
    local = sample("uv_pip_freeze_local_wheel.txt")
    assert parse_freeze(f"{local}six==1.17.0\n").duplicates == {
        "six": ("@ file:///tmp/cap17/wheels/six-1.16.0-py2.py3-none-any.whl", "1.17.0")
    }


# ---- issue 17 D8: packages from a direct URL or a local wheel -------------------------------

SIX_URL = (
    "https://files.pythonhosted.org/packages/b7/ce/149a00dd41f10bc29e5921b496af8b574d8"
    "413afcd5e30dfa0ed46c2cc5e/six-1.17.0-py2.py3-none-any.whl"
)
SIX_FILE = "file:///tmp/cap17/wheels/six-1.16.0-py2.py3-none-any.whl"


def test_a_local_wheels_install_line_names_the_package_its_version_and_its_file() -> None:
    # uv_pip_install_local_wheel.txt: ` + six==1.16.0 (from file:///...whl)`.
    text = sample("uv_pip_install_local_wheel.txt")
    assert parse_install_changes(text) == (Change("six", None, "1.16.0", None, SIX_FILE),)
    assert parse_install_set(text) == {"six": f"six @ {SIX_FILE}"}
    assert parse_resolved_version(text, "six") == "1.16.0"


@pytest.mark.parametrize(
    "name",
    [
        "uv_dry_run_direct_url.txt",
        "uv_pip_install_direct_url.txt",
        "uv_dry_run_direct_url_cold_cache.txt",
    ],
)
def test_a_direct_url_upgrade_is_a_change_and_its_url_is_what_the_prefetch_pins(name: str) -> None:
    # The dry run (wheel cached, and cold: ` + six @ URL` without a version) and the
    # install: six 1.16.0 from a local wheel -> 1.17.0 from a files.pythonhosted.org URL.
    text = sample(name)
    assert parse_install_changes(text) == (Change("six", "1.16.0", "1.17.0", SIX_FILE, SIX_URL),)
    assert parse_install_set(text) == {"six": f"six @ {SIX_URL}"}
    # What "latest" resolved to: the version, never the version with the URL.
    assert parse_resolved_version(text, "six") == "1.17.0"
    assert Change("six", "1.16.0", "1.17.0", SIX_FILE, SIX_URL).describe() == (
        "six 1.16.0 → 1.17.0"
    )


def test_the_same_version_from_another_source_is_a_change_that_names_both() -> None:
    # uv_dry_run_force_reinstall_url_to_index.txt: `--force-reinstall six==1.17.0` over a
    # six installed from a URL: uv itself prints `-` and `+`, not `~`: another wheel.
    text = sample("uv_dry_run_force_reinstall_url_to_index.txt")
    [change] = parse_install_changes(text)
    assert change == Change("six", "1.17.0", "1.17.0", SIX_URL, None)
    assert change.describe() == f"six 1.17.0 (from {SIX_URL}) → 1.17.0 (from the index)"
    assert Change.from_json(change.to_json()) == change
    assert parse_install_set(text) == {"six": "six==1.17.0"}
    # `~ six==1.17.0 (from URL)`: reinstalled from where it was, no change; and the
    # prefetch fetches it from that URL.
    again = sample("uv_pip_install_force_reinstall_direct_url.txt")
    assert parse_install_changes(again) == ()
    assert parse_install_set(again) == {"six": f"six @ {SIX_URL}"}


# Shaped after the wheel URLs vLLM publishes per commit (vllm-project/vllm#30464:
# https://wheels.vllm.ai/<commit>/vllm-<version>%2Bg<commit>-cp38-abi3-manylinux_2_31_x86_64.whl;
# vllm-project/recipes#66: a `%2Bg<commit>.cu129` wheel), with our own commit and version;
# the line's form is uv's (uv_pip_install_direct_url.txt).
VLLM_WHEEL = (
    "https://wheels.vllm.ai/1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d/"
    "vllm-0.16.1.dev7%2Bg1a2b3c4d5.cu129-cp38-abi3-manylinux_2_31_x86_64.whl"
)


def test_a_vllm_wheel_from_its_commit_url_reads_as_its_version() -> None:
    text = (
        f" - vllm==0.16.0\n + vllm==0.16.1.dev7+g1a2b3c4d5.cu129 (from {VLLM_WHEEL})\n"
        f" + extra @ {VLLM_WHEEL}\n"
    )
    assert parse_install_changes(text)[0] == Change(
        "vllm", "0.16.0", "0.16.1.dev7+g1a2b3c4d5.cu129", None, VLLM_WHEEL
    )
    assert parse_resolved_version(text, "vllm") == "0.16.1.dev7+g1a2b3c4d5.cu129"
    # The cold dry run's form: the version is the wheel file's, %2B read as "+".
    assert parse_entry(f"vllm @ {VLLM_WHEEL}") == Entry(
        "vllm", "0.16.1.dev7+g1a2b3c4d5.cu129", VLLM_WHEEL
    )
    # Another package's wheel, or a source URL, says no version: unknown, not guessed.
    assert parse_entry(f"extra @ {VLLM_WHEEL}") == Entry("extra", "", VLLM_WHEEL)
    assert parse_entry("plugin @ git+https://example.com/p.git@v1") == Entry(
        "plugin", "", "git+https://example.com/p.git@v1"
    )
    assert Change("plugin", None, "", None, "git+https://example.com/p.git").describe() == (
        "plugin (new) (from git+https://example.com/p.git)"
    )


def test_a_url_with_credentials_is_kept_for_uv_and_masked_where_it_is_shown() -> None:
    url = "https://alice:s3cr3t-t0ken@pypi.example.com/pkgs/six-1.17.0-py2.py3-none-any.whl"
    text = f" - six==1.17.0\n + six==1.17.0 (from {url})\n"
    # The prefetch's stdin (never shown) must reach the wheel: the URL as uv printed it.
    assert parse_install_set(text) == {"six": f"six @ {url}"}
    [change] = parse_install_changes(text)
    shown = Redactor()(change.describe())
    assert "s3cr3t-t0ken" not in shown and "alice:***@pypi.example.com" in shown
    assert Redactor()(str(change.to_json())).count("s3cr3t") == 0


def test_lines_that_name_no_single_package_stay_ignored() -> None:
    assert parse_entry("six>=1.0") is None and parse_entry("-e file:///src") is None
    assert parse_entry("six==1.0 (from not a url)") is None
    assert parse_install_changes(" + six>=1.0\n + (from https://x)\n") == ()


# ---- the CUDA build the index resolved ------------------------------------------------------


def test_pypis_default_build_of_vllm_0_31_is_named_cuda_13() -> None:
    # uv_dry_run_vllm_0.31.0_cuda13.txt: `uv pip install --dry-run vllm==0.31.0` into an
    # empty venv, from PyPI: torch 2.13.0 with no label, pulling cuda-toolkit 13.0.3.0 and
    # nvidia-cuda-runtime 13.0.96 (torch's own pin: cuda-toolkit[cudart,...]==13.0.3).
    changes = parse_install_changes(sample("uv_dry_run_vllm_0.31.0_cuda13.txt"))
    assert len(changes) == 198
    diff = planned_diff(parse_freeze(""), changes)
    assert diff.build == "torch 2.13.0 (CUDA 13.0, from cuda-toolkit 13.0.3.0)"
    assert f"  {BUILD_PREFIX}{diff.build}" in diff.lines()
    assert PackageDiff.from_json(diff.to_json()) == diff


def _cu129_move() -> tuple[Change, ...]:
    """A move from PyPI's CUDA 13 build to the cu129 one, as uv lists it when the index
    is PyTorch's cu129 index (download.pytorch.org/whl/cu129) and vLLM's
    (wheels.vllm.ai/<version>/cu129). Shape: astral-sh/uv issue #15446 (uv's
    `` + torch==2.7.1+cu128`` / `` + torchvision==0.22.1+cu128`` lines from PyTorch's
    index) and vllm-project/vllm#43847 (``vllm-0.21.0+cu129``); our versions."""
    return parse_install_changes(
        "Resolved 201 packages in 2.31s\n"
        "Would download 9 packages\nWould uninstall 3 packages\nWould install 9 packages\n"
        " + nvidia-cublas-cu12==12.9.1.4\n"
        " + nvidia-cuda-runtime-cu12==12.9.79\n"
        " + nvidia-cudnn-cu12==9.10.2.21\n"
        " + nvidia-nccl-cu12==2.27.5\n"
        " - torch==2.13.0\n"
        " + torch==2.13.0+cu129\n"
        " - torchvision==0.28.0\n"
        " + torchvision==0.28.0+cu129\n"
        " - vllm==0.31.0\n"
        " + vllm==0.31.0+cu129\n"
    )


def test_a_cu129_build_is_named_by_its_label_though_cuda_13_wheels_stay() -> None:
    before = parse_freeze(
        "cuda-toolkit==13.0.3.0\nnvidia-cuda-runtime==13.0.96\ntorch==2.13.0\n"
        "torchvision==0.28.0\nvllm==0.31.0\n"
    )
    diff = planned_diff(before, _cu129_move())
    assert diff.build == "torch 2.13.0+cu129 (CUDA 12.9, cu129 build)"
    # the same torch release, another build: a change, highlighted first
    assert diff.lines()[0] == "! torch 2.13.0 → 2.13.0+cu129"


def test_the_cuda_wheels_a_change_installs_outweigh_those_it_leaves_behind() -> None:
    """Moving from a cu129 environment to PyPI's CUDA 13 build: uv never removes, so the
    -cu12 runtime stays; the runtime the change installs is the one torch needs."""
    before = parse_freeze("nvidia-cuda-runtime-cu12==12.9.79\ntorch==2.12.1+cu129\n")
    move = (
        Change("cuda-toolkit", None, "13.0.3.0"),
        Change("nvidia-cuda-runtime", None, "13.0.96"),
        Change("torch", "2.12.1+cu129", "2.13.0"),
    )
    assert planned_diff(before, move).build == (
        "torch 2.13.0 (CUDA 13.0, from cuda-toolkit 13.0.3.0)"
    )


@pytest.mark.parametrize(
    ("freeze", "change", "build"),
    [
        # Nothing says: no label, no runtime wheel.
        ("torch==2.13.0\n", Change("vllm", "0.30.0", "0.31.0"), "CUDA build not known"),
        # Runtimes of two majors, neither installed by the change: not a guess either way.
        (
            "nvidia-cuda-runtime-cu12==12.9.79\nnvidia-cuda-runtime==13.0.96\ntorch==2.13.0\n",
            Change("vllm", "0.30.0", "0.31.0"),
            "CUDA build not known",
        ),
        # A wheel whose name says another major than its version is not evidence.
        (
            "nvidia-cuda-runtime-cu12==13.0.96\ntorch==2.13.0\n",
            Change("vllm", "0.30.0", "0.31.0"),
            "CUDA build not known",
        ),
        ("torch==2.13.0+cpu\n", Change("vllm", "0.30.0", "0.31.0"), "a CPU build"),
    ],
)
def test_an_unknown_build_is_said_unknown(freeze: str, change: Change, build: str) -> None:
    diff = planned_diff(parse_freeze(freeze), (change,))
    assert diff.build is not None and build in diff.build
    assert "CUDA 1" not in diff.build


def test_no_torch_no_build_line() -> None:
    diff = planned_diff(parse_freeze("six==1.16.0\n"), (Change("six", "1.16.0", "1.17.0"),))
    assert diff.build is None and not any(BUILD_PREFIX in line for line in diff.lines())
    # A record of before the build was kept reads back without one.
    assert PackageDiff.from_json({"changes": [], "unchanged": 3}).build is None
