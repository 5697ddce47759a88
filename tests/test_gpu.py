"""bot.core.gpu: nvidia-smi parsers, exit codes, drain verdict and the table."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.gpu import (
    APPS_QUERY_ARGV,
    GPU_QUERY_ARGV,
    LINE_LIMIT,
    NVIDIA_SMI_EXIT_CODES,
    DriverWarning,
    Gpu,
    GpuProcess,
    GpuSnapshot,
    build_snapshot,
    check_nvidia_smi,
    drain_verdict,
    driver_warnings,
    parse_apps_csv,
    parse_gpu_csv,
    parse_pgrep,
    render_table,
    short_gpu_name,
)
from bot.core.health import GpuReading, Level, judge
from bot.core.status import HostStatus
from bot.errors import GpuQueryError
from bot.hosts.base import CommandResult
from tests import test_sequence as seq

RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def uuid(i: int) -> str:
    return f"GPU-6f1c{i:04d}-1a2b-3c4d-5e6f-0123456789ab"


def gpu_text(n: int = 8, used: int = 97012) -> str:
    return "\n".join(f"{i}, {uuid(i)}, {RTX}, {used}, 97871, {i * 10}" for i in range(n)) + "\n"


def apps_text(n: int = 8) -> str:
    return "".join(f"{48301 + i}, VLLM::Worker_TP{i}, 96998 MiB, {uuid(i)}\n" for i in range(n))


# --------------------------------------------------------------------------- parse_gpu_csv


def test_parse_gpu_csv_reads_every_field() -> None:
    gpus = parse_gpu_csv("h1", gpu_text(2))
    assert gpus == (
        Gpu(0, uuid(0), RTX, 97012, 97871, 0),
        Gpu(1, uuid(1), RTX, 97012, 97871, 10),
    )


@pytest.mark.parametrize(
    "missing", ["[N/A]", "[Not Supported]", "[Unknown Error]", "N/A", "[Insufficient Permissions]"]
)
def test_parse_gpu_csv_missing_values_become_none(missing: str) -> None:
    (gpu,) = parse_gpu_csv("h1", f"3, {uuid(3)}, NVIDIA H200, {missing}, {missing}, {missing}")
    assert (gpu.index, gpu.name) == (3, "NVIDIA H200")
    assert (gpu.memory_used_mib, gpu.memory_total_mib, gpu.utilization_pct) == (None, None, None)


def test_parse_gpu_csv_keeps_commas_in_the_name() -> None:
    (gpu,) = parse_gpu_csv("h1", f"0, {uuid(0)}, Tesla V100, PCIe, 32GB, 5, 32510, 99")
    assert gpu.name == "Tesla V100, PCIe, 32GB"
    assert (gpu.memory_used_mib, gpu.memory_total_mib, gpu.utilization_pct) == (5, 32510, 99)


def test_parse_gpu_csv_ignores_blank_lines_and_crlf() -> None:
    text = (
        f"\r\n0, {uuid(0)}, NVIDIA H200, 1, 143771, 0\r\n\r\n   \r\n"
        f"1, {uuid(1)}, NVIDIA H200, 2, 143771, 7\r\n"
    )
    gpus = parse_gpu_csv("h1", text)
    assert [(g.index, g.uuid, g.memory_used_mib, g.utilization_pct) for g in gpus] == [
        (0, uuid(0), 1, 0),
        (1, uuid(1), 2, 7),
    ]


def test_parse_gpu_csv_empty_output_is_no_gpus() -> None:
    assert parse_gpu_csv("h1", "") == ()
    assert parse_gpu_csv("h1", "\n \n") == ()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("Failed to initialize NVML: Driver/library version mismatch", "expected 6 fields"),
        (f"0, {uuid(0)}, 1, 2, 3", "expected 6 fields, got 5"),
        (f"x, {uuid(0)}, H200, 1, 2, 3", "the GPU index is not a number: 'x'"),
        (f"-1, {uuid(0)}, H200, 1, 2, 3", "the GPU index is not a number"),
        ("0, , H200, 1, 2, 3", "not a GPU UUID"),
        ("0, GPU 1, H200, 1, 2, 3", "not a GPU UUID"),
        ("0, [N/A], H200, 1, 2, 3", "not a GPU UUID"),
        (f"0, {uuid(0)}, , 1, 2, 3", "the GPU name is empty"),
        (f"0, {uuid(0)}, H200, 1 MiB, 2, 3", "memory.used is not a number: '1 MiB'"),
        (f"0, {uuid(0)}, H200, 1, 2.5, 3", "memory.total is not a number"),
        (f"0, {uuid(0)}, H200, 1, 2, 3%", "utilization.gpu is not a number"),
        (f"0, {uuid(0)}, H200, 1_000, 2, 3", "memory.used is not a number"),
    ],
)
def test_parse_gpu_csv_rejects_malformed_lines(line: str, why: str) -> None:
    text = f"1, {uuid(1)}, NVIDIA H200, 1, 2, 3\n{line}\n"
    with pytest.raises(GpuQueryError) as caught:
        parse_gpu_csv("gpu-a1", text)
    message = str(caught.value)
    assert message.startswith("gpu-a1: unexpected line from nvidia-smi --query-gpu: ")
    assert repr(line) in message
    assert why in message
    assert caught.value.host == "gpu-a1"
    assert caught.value.output == text


def test_parse_gpu_csv_quotes_a_long_line_cut_short() -> None:
    with pytest.raises(GpuQueryError) as caught:
        parse_gpu_csv("h1", "x" * 5000)
    assert "x" * 200 + "..." in str(caught.value)
    assert "x" * 201 not in str(caught.value)


@pytest.mark.parametrize("dup", [f"0, {uuid(9)}", f"9, {uuid(0)}"])
def test_parse_gpu_csv_rejects_a_gpu_listed_twice(dup: str) -> None:
    text = f"0, {uuid(0)}, H200, 1, 2, 3\n{dup}, H200, 1, 2, 3\n"
    with pytest.raises(GpuQueryError, match="twice"):
        parse_gpu_csv("h1", text)


# --------------------------------------------------------------------------- parse_apps_csv


def test_parse_apps_csv_reads_every_field() -> None:
    assert parse_apps_csv("h1", apps_text(2)) == (
        GpuProcess(48301, "VLLM::Worker_TP0", 96998, uuid(0)),
        GpuProcess(48302, "VLLM::Worker_TP1", 96998, uuid(1)),
    )


@pytest.mark.parametrize(
    "text", ["", "\n", "No running processes found\n", "  no running processes found \r\n"]
)
def test_parse_apps_csv_no_processes(text: str) -> None:
    assert parse_apps_csv("h1", text) == ()


@pytest.mark.parametrize("memory", ["[N/A]", "[Not Supported]", "[Insufficient Permissions]"])
def test_parse_apps_csv_unreported_memory_is_none(memory: str) -> None:
    (proc,) = parse_apps_csv("h1", f"7, [Not Found], {memory}, {uuid(0)}\r\n")
    assert proc == GpuProcess(7, "[Not Found]", None, uuid(0))


def test_parse_apps_csv_keeps_commas_in_the_process_name() -> None:
    (proc,) = parse_apps_csv("h1", f"12, python -c print(1,2), x, 10 MiB, {uuid(2)}")
    assert proc == GpuProcess(12, "python -c print(1,2), x", 10, uuid(2))


def test_parse_apps_csv_accepts_memory_without_unit() -> None:
    (proc,) = parse_apps_csv("h1", f"12, python, 10, {uuid(2)}")
    assert proc.used_mib == 10


def test_parse_apps_csv_allows_an_empty_name() -> None:
    (proc,) = parse_apps_csv("h1", f"12, , 10 MiB, {uuid(2)}")
    assert proc.name == ""


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("No devices were found", "expected 4 fields, got 1"),
        (f"12, 10 MiB, {uuid(0)}", "expected 4 fields, got 3"),
        (f"pid, name, 10 MiB, {uuid(0)}", "the PID is not a number: 'pid'"),
        (f"12, name, 10 GiB, {uuid(0)}", "used_memory is not a MiB amount: '10 GiB'"),
        (f"12, name, lots, {uuid(0)}", "used_memory is not a MiB amount"),
        ("12, name, 10 MiB, ", "not a GPU UUID"),
    ],
)
def test_parse_apps_csv_rejects_malformed_lines(line: str, why: str) -> None:
    with pytest.raises(GpuQueryError) as caught:
        parse_apps_csv("gpu-a1", line)
    message = str(caught.value)
    assert message.startswith("gpu-a1: unexpected line from nvidia-smi --query-compute-apps: ")
    assert repr(line.strip()) in message
    assert why in message


# --------------------------------------------------------------------------- check_nvidia_smi


def result(
    exit_status: int | None,
    stdout: str = "",
    stderr: str = "",
    *,
    timed_out: bool = False,
    signal: str | None = None,
) -> CommandResult:
    return CommandResult(
        GPU_QUERY_ARGV, exit_status, stdout, stderr, 12.4, signal=signal, timed_out=timed_out
    )


def test_check_nvidia_smi_accepts_success() -> None:
    check_nvidia_smi("h1", result(0, gpu_text(1)))


DOCUMENTED = {
    2: "argument or flag is invalid",
    3: "not available on the target device",
    4: "does not have permission",
    6: "a query to find an object was unsuccessful",
    8: "external power cables are not properly attached",
    9: "NVIDIA driver is not loaded",
    10: "interrupt issue with a GPU",
    12: "NVML shared library could not be found or loaded",
    13: "NVML does not implement this function",
    14: "infoROM is corrupted",
    15: "fallen off the bus",
    18: "driver and library versions do not match",
    126: "not executable",
    127: "command not found",
    255: "internal driver error",
}


@pytest.mark.parametrize(("code", "meaning"), sorted(DOCUMENTED.items()))
def test_check_nvidia_smi_explains_each_exit_code(code: int, meaning: str) -> None:
    said = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    with pytest.raises(GpuQueryError) as caught:
        check_nvidia_smi("gpu-a1", result(code, said + "\nMake sure the driver is installed.\n"))
    error = caught.value
    assert str(error).startswith(f"gpu-a1: nvidia-smi failed with exit status {code}: ")
    assert meaning in str(error)
    assert repr(said) in str(error)  # the first line nvidia-smi printed, not the second
    assert "Make sure" not in str(error)
    assert error.exit_status == code
    assert "Make sure the driver is installed." in error.output


# Quoted from issue 9 (seen on a host where one of two GPUs failed): nvidia-smi still
# printed the healthy GPU 0 row, then this line, and exited non-zero.  The issue does
# not record the exit status, so the test holds for any failing one.
ONE_GPU_FAILED = "Unable to determine the device handle for GPU0000:02:00.0: Unknown Error"


@pytest.mark.parametrize("code", [15, 255])
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_check_nvidia_smi_quotes_the_failing_gpu_not_the_healthy_row(
    code: int, stream: str
) -> None:
    healthy = gpu_text(1).strip()
    if stream == "stdout":
        r = result(code, f"{healthy}\n{ONE_GPU_FAILED}\n")
    else:
        r = result(code, f"{healthy}\n", f"{ONE_GPU_FAILED}\n")
    with pytest.raises(GpuQueryError) as caught:
        check_nvidia_smi("gpu-a1", r)
    assert str(caught.value).endswith(f": {ONE_GPU_FAILED!r}")
    assert healthy not in str(caught.value)
    assert healthy in caught.value.output  # the whole output is still kept


def test_check_nvidia_smi_quotes_a_row_when_rows_are_all_it_printed() -> None:
    with pytest.raises(GpuQueryError) as caught:
        check_nvidia_smi("h1", result(255, gpu_text(2)))
    assert str(caught.value).endswith(f": {gpu_text(1).strip()!r}")


def test_every_documented_code_is_covered_by_the_table() -> None:
    assert set(NVIDIA_SMI_EXIT_CODES) == set(DOCUMENTED)


def test_check_nvidia_smi_unknown_code_and_stderr() -> None:
    with pytest.raises(GpuQueryError) as caught:
        check_nvidia_smi("h1", result(42, "", "\n  boom  \n"))
    assert str(caught.value) == "h1: nvidia-smi failed with exit status 42: unknown error: 'boom'"
    assert caught.value.output == "\n  boom  \n"


def test_check_nvidia_smi_failure_without_output() -> None:
    with pytest.raises(GpuQueryError) as caught:
        check_nvidia_smi("h1", result(9))
    assert str(caught.value) == (
        "h1: nvidia-smi failed with exit status 9: the NVIDIA driver is not loaded"
    )


def test_check_nvidia_smi_timeout_wins_over_exit_status() -> None:
    with pytest.raises(GpuQueryError) as caught:
        check_nvidia_smi("h1", result(0, gpu_text(1), timed_out=True))
    assert "nvidia-smi did not finish within 12 s" in str(caught.value)
    assert "hung driver" in str(caught.value)


def test_check_nvidia_smi_killed_by_signal() -> None:
    with pytest.raises(GpuQueryError) as caught:
        check_nvidia_smi("h1", result(None, signal="KILL"))
    assert str(caught.value) == "h1: nvidia-smi was killed by signal KILL"
    assert caught.value.exit_status is None


# --------------------------------------------------------------------------- build_snapshot


def test_build_snapshot_attaches_processes_by_uuid() -> None:
    apps = apps_text(2) + f"77, other, 5 MiB, {uuid(1)}\n88, ghost, 9 MiB, MIG-0000\n"
    snap = build_snapshot("h1", gpu_text(3), apps)
    assert snap.host == "h1"
    assert [g.index for g in snap.gpus] == [0, 1, 2]
    assert [p.pid for p in snap.gpus[0].processes] == [48301]
    assert [p.pid for p in snap.gpus[1].processes] == [48302, 77]
    assert snap.gpus[2].processes == ()
    assert [p.pid for p in snap.processes] == [48301, 48302, 77, 88]  # 88 matches no GPU
    assert snap.used_mib == 3 * 97012
    assert snap.total_mib == 3 * 97871


def test_build_snapshot_raises_for_either_bad_input() -> None:
    with pytest.raises(GpuQueryError, match="query-gpu"):
        build_snapshot("h1", "garbage", "")
    with pytest.raises(GpuQueryError, match="query-compute-apps"):
        build_snapshot("h1", gpu_text(1), "garbage")


def test_argv_matches_what_the_parsers_expect() -> None:
    assert GPU_QUERY_ARGV[1].removeprefix("--query-gpu=").split(",") == [
        "index",
        "uuid",
        "name",
        "memory.used",
        "memory.total",
        "utilization.gpu",
    ]
    assert "nounits" in GPU_QUERY_ARGV[2]
    assert APPS_QUERY_ARGV[1].removeprefix("--query-compute-apps=").split(",") == [
        "pid",
        "process_name",
        "used_memory",
        "gpu_uuid",
    ]
    assert "nounits" not in APPS_QUERY_ARGV[2]


# --------------------------------------------------------------------------- drain


def snapshot(gpus: str, apps: str = "") -> GpuSnapshot:
    return build_snapshot("h1", gpus, apps)


def test_drained_when_nothing_holds_a_gpu() -> None:
    verdict = drain_verdict(snapshot(gpu_text(8, used=3)), 1024)
    assert verdict.drained
    assert verdict.holders == ()
    assert verdict.holders == ()
    assert verdict.describe() == "drained: no GPU process, every GPU at or below 1024 MiB"


def test_threshold_is_inclusive() -> None:
    assert drain_verdict(snapshot(gpu_text(1, used=1024)), 1024).drained
    assert not drain_verdict(snapshot(gpu_text(1, used=1025)), 1024).drained


def test_a_process_holding_memory_blocks_the_drain() -> None:
    snap = snapshot(gpu_text(4, used=3), f"48304, VLLM::Worker_TP3, 96000 MiB, {uuid(3)}\n")
    verdict = drain_verdict(snap, 1024)
    assert not verdict.drained
    (holder,) = verdict.holders
    assert (holder.kind, holder.gpu_index, holder.pid, holder.used_mib) == (
        "process",
        3,
        48304,
        96000,
    )
    assert holder.describe() == "GPU 3: 96000 MiB held by PID 48304 (VLLM::Worker_TP3)"
    assert verdict.describe() == "GPU 3: 96000 MiB held by PID 48304 (VLLM::Worker_TP3)"
    assert {h.pid for h in verdict.holders} == {48304}


def test_a_small_process_blocks_even_under_the_threshold() -> None:
    snap = snapshot(gpu_text(1, used=300), f"5, python, 200 MiB, {uuid(0)}\n")
    assert [h.pid for h in drain_verdict(snap, 1024).holders] == [5]


def test_a_process_with_zero_memory_does_not_block() -> None:
    snap = snapshot(gpu_text(1, used=3), f"5, python, 0 MiB, {uuid(0)}\n")
    assert drain_verdict(snap, 1024).drained


def test_a_process_with_unreported_memory_blocks() -> None:
    snap = snapshot(gpu_text(1, used=3), f"5, python, [N/A], {uuid(0)}\n")
    (holder,) = drain_verdict(snap, 1024).holders
    assert holder.describe() == "GPU 0: memory held by PID 5 (python)"


def test_a_process_on_an_unknown_gpu_blocks_and_names_the_uuid() -> None:
    snap = snapshot(gpu_text(1, used=3), "5, python, 10 MiB, MIG-abc\n")
    (holder,) = drain_verdict(snap, 1024).holders
    assert holder.gpu_index is None
    assert holder.describe() == "GPU MIG-abc: 10 MiB held by PID 5 (python)"


def test_memory_above_threshold_without_a_process() -> None:
    text = f"0, {uuid(0)}, H200, 3, 143771, 0\n1, {uuid(1)}, H200, 60000, 143771, 0\n"
    (holder,) = drain_verdict(snapshot(text), 1024).holders
    assert (holder.kind, holder.gpu_index, holder.pid) == ("memory", 1, None)
    assert holder.describe() == "GPU 1: 60000 MiB used, no process listed"


def test_memory_that_cannot_be_read_counts_as_held() -> None:
    text = f"0, {uuid(0)}, H200, [Unknown Error], 143771, 0"
    (holder,) = drain_verdict(snapshot(text), 1024).holders
    assert holder.describe() == "GPU 0: memory use not reported, cannot confirm it is free"


def test_memory_not_reported_by_design_is_judged_by_processes() -> None:
    # Issue 12: a unified-memory GPU (GB10) prints [N/A] for memory.used: the drain then
    # decides by its processes, and says so (tests/test_gpu_service.py has the rest).
    verdict = drain_verdict(snapshot(f"0, {uuid(0)}, NVIDIA GB10, [N/A], [N/A], 0"), 1024)
    assert verdict.drained and verdict.by_processes == (0,)
    assert "judged by processes alone" in verdict.describe()


def test_a_gpu_with_a_process_is_not_listed_twice() -> None:
    snap = snapshot(gpu_text(1), f"48301, VLLM::Worker_TP0, 96998 MiB, {uuid(0)}\n")
    assert [h.kind for h in drain_verdict(snap, 1024).holders] == ["process"]


def test_surviving_workers_block_unless_already_listed() -> None:
    snap = snapshot(gpu_text(2, used=3), f"48301, VLLM::Worker_TP0, 500 MiB, {uuid(0)}\n")
    workers = parse_pgrep("48301 VLLM::Worker_TP0\n48399 VLLM::EngineCore\n")
    verdict = drain_verdict(snap, 1024, workers)
    assert [(h.kind, h.pid) for h in verdict.holders] == [("process", 48301), ("worker", 48399)]
    assert verdict.holders[1].describe() == "PID 48399 (VLLM::EngineCore) is still running"
    assert {h.pid for h in verdict.holders} == {48301, 48399}


def test_holders_are_ordered_by_gpu_then_unknown_gpu_then_worker() -> None:
    apps = f"9, b, 5 MiB, {uuid(2)}\n8, a, 5 MiB, MIG-x\n7, c, 5 MiB, {uuid(0)}\n"
    verdict = drain_verdict(snapshot(gpu_text(3, used=3), apps), 1024, [(1, "VLLM::x")])
    assert [h.pid for h in verdict.holders] == [7, 9, 8, 1]
    assert verdict.describe().count("; ") == 3


def test_drain_verdict_sees_processes_only_attached_to_gpus() -> None:
    proc = GpuProcess(5, "python", 10, uuid(0))
    snap = GpuSnapshot("h1", (Gpu(0, uuid(0), "H200", 3, 100, 0, (proc,)),))
    assert [h.pid for h in drain_verdict(snap, 1024).holders] == [5]


# --------------------------------------------------------------------------- parse_pgrep


def test_parse_pgrep() -> None:
    text = "48301 VLLM::Worker_TP0\n\n48302   VLLM::Worker_TP1 --flag\r\n7\n"
    assert parse_pgrep(text) == (
        (48301, "VLLM::Worker_TP0"),
        (48302, "VLLM::Worker_TP1 --flag"),
        (7, ""),
    )


def test_parse_pgrep_empty() -> None:
    assert parse_pgrep("") == ()


def test_parse_pgrep_joins_a_command_line_that_contained_a_newline() -> None:
    assert parse_pgrep("12 VLLM::x --prompt first\nsecond half\n13 VLLM::y\n") == (
        (12, "VLLM::x --prompt first second half"),
        (13, "VLLM::y"),
    )


def test_parse_pgrep_rejects_leading_garbage() -> None:
    with pytest.raises(GpuQueryError) as caught:
        parse_pgrep("pgrep: invalid option\n12 VLLM::x\n", host="gpu-a1")
    assert str(caught.value) == (
        "gpu-a1: unexpected line from pgrep (no PID): 'pgrep: invalid option'"
    )


# --------------------------------------------------------------------------- rendering


def eight_gpu_snapshot() -> GpuSnapshot:
    return build_snapshot("gpu-a1.example.internal", gpu_text(8), apps_text(8))


def test_table_shape_for_eight_gpus() -> None:
    lines = render_table(eight_gpu_snapshot()).split("\n")
    assert lines[0] == "gpu-a1.example.internal: 8 GPUs"
    header = lines[1]
    assert header.split() == ["GPU", "NAME", "USED", "MiB", "TOTAL", "MiB", "UTIL", "PROCESSES"]
    assert len(lines) == 2 + 8 + 1
    for line in lines:
        assert len(line) <= LINE_LIMIT
        assert line == line.rstrip()
    used_end = header.index("USED MiB") + len("USED MiB")
    total_end = header.index("TOTAL MiB") + len("TOTAL MiB")
    util_end = header.index("UTIL") + len("UTIL")
    procs_at = header.index("PROCESSES")
    for i, row in enumerate(lines[2:10]):
        assert row[:3] == f"{i:>3}"
        assert row[5:30] == "RTX PRO 6000 Blackwell SE"
        assert row[:used_end].endswith(" 97012")
        assert row[:total_end].endswith(" 97871")
        assert row[:util_end].endswith(f" {i * 10}%")
        assert row[procs_at:] == f"{48301 + i} VLLM::Worker_TP{i} 96998 MiB"
    total = lines[-1]
    assert total[:used_end].split() == ["total", "776096"]
    assert total[:total_end].endswith(" 782968")
    assert total[:util_end].endswith(" 35%")
    assert total[procs_at:] == "8 processes"


def test_table_continues_extra_processes_on_their_own_rows() -> None:
    apps = apps_text(2) + f"5, helper, 12 MiB, {uuid(0)}\n"
    lines = render_table(build_snapshot("h", gpu_text(2), apps)).split("\n")
    procs_at = lines[1].index("PROCESSES")
    assert lines[2][procs_at:] == "48301 VLLM::Worker_TP0 96998 MiB"
    assert lines[3] == " " * procs_at + "5 helper 12 MiB"
    assert lines[4][procs_at:] == "48302 VLLM::Worker_TP1 96998 MiB"
    assert lines[-1].endswith("3 processes")


def test_table_cuts_long_process_names_to_the_line_limit() -> None:
    long_name = "/opt/venvs/vllm/bin/python3 -m vllm.entrypoints.openai.api_server " * 3
    apps = f"4194303, {long_name}, 1234567 MiB, {uuid(0)}\n"
    lines = render_table(build_snapshot("h", gpu_text(1), apps)).split("\n")
    row = lines[2]
    assert len(row) == LINE_LIMIT
    assert row.endswith("… 1234567 MiB")
    assert row.endswith("  4194303 /opt/venvs/vllm/bin/… 1234567 MiB")


def test_table_lists_processes_on_unknown_gpus_and_missing_values() -> None:
    gpus = f"0, {uuid(0)}, NVIDIA H200, [N/A], [N/A], [Not Supported]\n"
    lines = render_table(build_snapshot("h", gpus, "5, ghost, [N/A], MIG-1234\n")).split("\n")
    assert lines[2].split() == ["0", "H200", "n/a", "n/a", "n/a"]
    assert lines[3].split() == ["?", "MIG-1234", "5", "ghost", "n/a"]
    # A total over values nobody reported is unknown, never 0 (issue 12).
    assert lines[4].split() == ["total", "n/a", "n/a", "n/a", "1", "process"]


def test_table_for_one_gpu_and_for_none() -> None:
    assert render_table(build_snapshot("h", gpu_text(1), "")).split("\n")[0] == "h: 1 GPU"
    assert render_table(GpuSnapshot("h", ())) == "h: 0 GPUs, nothing reported"


def test_table_neutralises_control_characters_and_backticks() -> None:
    proc = GpuProcess(5, "evil\x1b[2J```\n<!channel>", 10, uuid(0))
    snap = GpuSnapshot("h", (Gpu(0, uuid(0), "H200`\t", 1, 2, 3, (proc,)),), (proc,))
    text = render_table(snap)
    assert "\x1b" not in text
    assert "`" not in text
    assert "\t" not in text
    assert "5 evil?[2J????<!channel> 10 MiB" in text
    assert len(text.split("\n")) == 4  # the newline in the name did not add a row


@pytest.mark.parametrize(
    ("name", "short"),
    [
        (RTX, "RTX PRO 6000 Blackwell SE"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX PRO 6000 Blackwell WE"),
        ("Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB"),
        ("NVIDIA A-very-long-name-that-will-not-fit-anywhere", "A-very-long-name-that-wi…"),
        ("NVIDIA ", "NVIDIA"),
    ],
)
def test_short_gpu_name(name: str, short: str) -> None:
    assert short_gpu_name(name) == short
    assert len(short_gpu_name(name)) <= 25


# --------------------------------------------------------------------------- properties

SAFE = st.text(st.sampled_from("abcXYZ019 -_()/,.:"), min_size=1, max_size=40)
NAMES = SAFE.filter(lambda s: s == s.strip() and not (s.startswith("[") and s.endswith("]")))
UUIDS = st.text(st.sampled_from("0123456789abcdefGPU-"), min_size=1, max_size=40)
AMOUNT = st.one_of(st.none(), st.integers(0, 10**7))


def cell(value: int | None) -> str:
    return "[N/A]" if value is None else str(value)


@given(st.lists(st.tuples(NAMES, AMOUNT, AMOUNT, AMOUNT), max_size=8), st.booleans())
@settings(max_examples=60, deadline=None)
def test_gpu_rows_round_trip(
    rows: list[tuple[str, int | None, int | None, int | None]], crlf: bool
) -> None:
    gpus = tuple(
        Gpu(i, uuid(i), name, used, total, util, memory_note="" if used is not None else cell(used))
        for i, (name, used, total, util) in enumerate(rows)
    )
    end = "\r\n" if crlf else "\n"
    text = end.join(
        f"{g.index}, {g.uuid}, {g.name}, {cell(g.memory_used_mib)}, "
        f"{cell(g.memory_total_mib)}, {cell(g.utilization_pct)}"
        for g in gpus
    )
    assert parse_gpu_csv("h", text) == gpus
    table = render_table(GpuSnapshot("h", gpus))
    assert all(len(line) <= LINE_LIMIT and line == line.rstrip() for line in table.split("\n"))


@given(st.lists(st.tuples(st.integers(0, 2**22), SAFE.map(str.strip), AMOUNT, UUIDS), max_size=8))
@settings(max_examples=60, deadline=None)
def test_app_rows_round_trip(rows: list[tuple[int, str, int | None, str]]) -> None:
    procs = tuple(GpuProcess(pid, name, used, gpu) for pid, name, used, gpu in rows)
    text = "".join(
        f"{p.pid}, {p.name}, {'[N/A]' if p.used_mib is None else f'{p.used_mib} MiB'}"
        f", {p.gpu_uuid}\n"
        for p in procs
    )
    assert parse_apps_csv("h", text) == procs


@given(st.text(max_size=300))
@settings(max_examples=200, deadline=None)
def test_parsers_only_ever_raise_gpu_query_error(text: str) -> None:
    for parse in (lambda t: parse_gpu_csv("h", t), lambda t: parse_apps_csv("h", t), parse_pgrep):
        try:
            parse(text)
        except GpuQueryError as exc:
            assert exc.host in {"h", "unknown host"}


# --------------------------------------------------------------------------- issue 17, D11

# nvidia-smi's infoROM warning: the line as NVIDIA/DCGM issue #2 shows it (a V100 on
# 450.80.02) and as a public nvidia-smi capture with "WARNING: infoROM is corrupted at
# gpu 0000:67:00.0" after its table (also NVIDIA/gpu-operator issue #20, "... at gpu
# 0000:B3:00.0"); nvidia-smi exits 14 for it (NVIDIA's GPU Operator troubleshooting,
# "infoROM is corrupted (nvidia-smi return code 14)"; microsoft/pai issue #3756). Our
# own address and rows around it.
INFOROM = "WARNING: infoROM is corrupted at gpu 0000:67:00.0"


@pytest.mark.parametrize("status", [0, 14])
@pytest.mark.parametrize("where", ["before", "between", "stderr"])
def test_the_inforom_warning_leaves_the_rows_readable(status: int, where: str) -> None:
    rows = gpu_text(2)
    stdout = {
        "before": f"{INFOROM}\n{rows}",
        "between": rows.replace("\n", f"\n{INFOROM}\n", 1),
        "stderr": rows,
    }[where]
    r = result(status, stdout, f"{INFOROM}\n" if where == "stderr" else "")
    check_nvidia_smi("h1", r)
    snap = build_snapshot("h1", r.stdout, apps_text(2), (r.stderr,))
    assert [g.index for g in snap.gpus] == [0, 1]
    assert snap.warnings == (DriverWarning("inforom_corrupted", "0000:67:00.0", INFOROM),)
    assert parse_apps_csv("h1", f"{INFOROM}\n{apps_text(1)}")[0].pid == 48301


@pytest.mark.parametrize(
    "line",
    [
        "WARNING: something else is wrong at gpu 0000:67:00.0",
        "WARNING: infoROM is corrupted at gpu 0000:67:00.0 and more",
        "infoROM is corrupted",
    ],
)
def test_a_line_that_is_not_a_known_warning_is_still_an_error(line: str) -> None:
    with pytest.raises(GpuQueryError, match="unexpected line from nvidia-smi --query-gpu"):
        parse_gpu_csv("h1", f"{line}\n{gpu_text(1)}")
    with pytest.raises(GpuQueryError, match="exit status 14"):
        check_nvidia_smi("h1", result(14, gpu_text(1), f"{line}\n"))
    assert driver_warnings(line) == ()


def test_exit_14_without_the_warning_is_still_a_failure() -> None:
    with pytest.raises(GpuQueryError, match="exit status 14: the infoROM is corrupted"):
        check_nvidia_smi("h1", result(14, gpu_text(1)))
    with pytest.raises(GpuQueryError, match="exit status 15"):
        check_nvidia_smi("h1", result(15, f"{INFOROM}\n{gpu_text(1)}"))


def test_the_warning_is_a_warning_on_the_gpu_at_that_address() -> None:
    gpus = parse_gpu_csv("h1", gpu_text(2))
    (w,) = driver_warnings(INFOROM)
    at_67 = (
        GpuReading(uuid(0), "0000:3b:00", 0, 0, False, False, False, "None"),
        GpuReading(uuid(1), "0000:67:00", 0, 0, False, False, False, "None"),
    )
    h = judge("h1", gpus, at_67, (), warnings=(w,))
    assert [g.level for g in h.gpus] == [Level.OK, Level.WARN]
    (said,) = h.problems(Level.WARN)
    assert said.startswith(f"GPU 1: nvidia-smi warns that the infoROM is corrupted ({INFOROM})")
    # An address no reading names: the host's warning, never dropped.
    nowhere = judge("h1", gpus, at_67[:1], (), warnings=(w,))
    assert nowhere.level() == Level.WARN and nowhere.host_findings


class InfoRomHost(seq.Host):
    """The sequence host whose GPU query warns of GPU 3's infoROM and exits 14."""

    def respond(self, action: Any) -> Any:
        r = super().respond(action)
        if isinstance(r, CommandResult) and r.argv[1:2] == GPU_QUERY_ARGV[1:2] and r.ok:
            return dataclasses.replace(
                r,
                exit_status=14,
                stdout=f"WARNING: infoROM is corrupted at gpu 0000:61:00.0\n{r.stdout}",
            )
        return r


def test_a_host_whose_gpu_query_warns_of_the_inforom_still_runs_with_the_warning() -> None:
    # GPU 3 of the sequence host is at 0000:61:00 (its nvidia-smi -q says so).
    q = "GPU 00000000:61:00.0\n    GPU UUID : " + seq.UUIDS[3] + "\n"
    host = InfoRomHost(health_q=q)
    outcome = seq.run(host, "restart")
    assert outcome.status == HostStatus.SUCCEEDED, outcome.summary
    check = next(
        n for n in host.notices if getattr(n, "step", None) == "gpu_check" and hasattr(n, "ok")
    )
    assert (
        check.ok
        and "warning: GPU 3: nvidia-smi warns that the infoROM is corrupted" in check.summary
    )
