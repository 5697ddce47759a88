"""bot.core.packages: uv's install reports and freezes, parsed on real captured output.

Every sample here is real uv 0.13.9 output from tests/samples (see SOURCES.md there):
a vLLM 0.32.0 -> 0.33.0 upgrade that also moves torch 2.13.0 -> 2.14.0, its dry run,
and the freezes before and after it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.packages import (
    Change,
    PackageDiff,
    diff_freezes,
    downloaded_bytes,
    highlighted,
    parse_freeze,
    parse_install_changes,
    parse_install_set,
    planned_diff,
)

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
    assert parse_install_changes(sample("uv_pip_install_upgrade_torch_change.txt")) == \
        TORCH_CHANGE


@pytest.mark.parametrize("name", ["uv_dry_run_no_change.txt",
                                  "uv_pip_install_already_satisfied.txt",
                                  "uv_dry_run_unsatisfiable.txt"])
def test_outputs_without_a_change_list_change_nothing(name: str) -> None:
    assert parse_install_changes(sample(name)) == ()


def test_small_dry_run_with_one_upgrade_and_one_new_package() -> None:
    # uv_small_dry_run_upgrade.txt: `uv pip install --dry-run packaging==24.1 six`.
    assert parse_install_changes(sample("uv_small_dry_run_upgrade.txt")) == (
        Change("packaging", "23.2", "24.1"), Change("six", None, "1.17.0"))


def test_a_reinstall_at_the_same_version_is_no_change() -> None:
    # uv prints `~ name==version` for a package --reinstall put back as it was.
    text = " ~ numpy==2.2.6\n - torch==2.9.1\n + torch==2.10.0\n - gone==1.0\n"
    assert parse_install_changes(text) == (Change("torch", "2.9.1", "2.10.0"),
                                           Change("gone", "1.0", None))


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
    assert sorted(diff.changes, key=lambda c: c.name) == sorted(TORCH_CHANGE,
                                                                 key=lambda c: c.name)
    assert diff.unchanged == 197 - 9  # nine packages moved, one (orjson) is new
    assert diff_freezes(before, before) == PackageDiff((), 197)


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
        "-e file:///src/plugin (removed)", "plugin @ file:///src/plugin-2 (new)"]
    assert diff.unchanged == 1
    assert before.digest != after.digest and len(before.digest) == 64


def test_highlights_and_lines_for_the_card() -> None:
    before = parse_freeze(sample("uv_pip_freeze_vllm_0.32.0.txt"))
    diff = planned_diff(before, TORCH_CHANGE)
    assert diff.unchanged == 197 - 9
    assert [c.name for c in diff.highlights] == [
        "flashinfer-python", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "torch", "torchvision",
        "triton", "vllm"]
    lines = diff.lines()
    # torch and vllm first, then the rest of the CUDA stack, then everything else.
    assert lines[:3] == ["! torch 2.13.0 → 2.14.0", "! vllm 0.32.0 → 0.33.0",
                         "! flashinfer-python 0.7.0.post1 → 0.7.2.post1"]
    assert "  orjson (new) 3.13.0" in lines and lines.index("  orjson (new) 3.13.0") > 6
    assert lines[-1] == "  188 other packages unchanged"
    assert diff.lines(limit=2)[2] == "  … and 8 more"
    assert diff.headline() == ("torch 2.13.0 → 2.14.0, vllm 0.32.0 → 0.33.0, "
                               "flashinfer-python 0.7.0.post1 → 0.7.2.post1 and 7 more")
    assert PackageDiff.from_json(diff.to_json()) == diff


@pytest.mark.parametrize(("name", "expected"), [
    ("torch", True), ("Torch", True), ("triton", True), ("transformers", True),
    ("flashinfer-python", True), ("nvidia-cuda-runtime", True), ("nvidia_nccl_cu13", True),
    ("cupy-cuda12x", True), ("numpy", False), ("orjson", False), ("fastapi", False)])
def test_what_is_highlighted(name: str, expected: bool) -> None:
    assert highlighted(name) is expected


def test_what_the_install_installs_is_every_plus_and_tilde_line() -> None:
    # uv_dry_run_torch_change.txt: without --force-reinstall, only the ten moved ones.
    installs = parse_install_set(sample("uv_dry_run_torch_change.txt"))
    assert installs == {c.name: c.after for c in TORCH_CHANGE}
    assert parse_install_set(" ~ numpy==2.2.6\n - torch==2.9.1\n + torch==2.10.0\n") == {
        "numpy": "2.2.6", "torch": "2.10.0"}
