"""Start-up phases and failures read from vLLM's journal lines (bot.core.startup).

No real start-up journal of a GPU host is in tests/samples (none could be captured on
a machine without a GPU; see SOURCES.md). So the lines below are written in vLLM's
exact log format, each from the format string in the vLLM source file named beside
it: the logger's ``LEVEL MM-DD HH:MM:SS [file.py:line] message`` (vllm/logger.py's
``_FORMAT``), the process prefix ``(EngineCore_DP0 pid=N)`` that vLLM's multiprocessing
adds, and tqdm bars in vLLM's ``_BAR_FORMAT`` or tqdm's default format. The values
(model, times, counts) are ours. The one real capture, tests/samples/
vllm_serve_no_gpu_0.33.0.log, is read as it was printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.startup import (
    Phase,
    StartHistory,
    StartupWatch,
    clean,
    describe_failure,
    failure_of,
    new_lines,
    phase_of,
    progress_text,
    thread_block,
)
from tests.test_real_vllm_samples import PERMISSION, usage_thread_traceback

SAMPLES = Path(__file__).parent / "samples"
ENGINE = "(EngineCore_DP0 pid=48253) "
API = "(APIServer pid=48213) "

# (line, phase, percent, where the format comes from)
START_UP: list[tuple[str, Phase, int | None, str]] = [
    (
        "Started vllm-kimi-k25.service - vLLM Kimi-K2.5 (INT4).",
        Phase.STARTING,
        None,
        "systemd's unit start message",
    ),
    (
        API + "INFO 11-30 13:02:11 [api_server.py:1839] vLLM API server version 0.16.0",
        Phase.STARTING,
        None,
        'vllm/entrypoints/openai/api_server.py: logger.info("vLLM API server version %s", ...)',
    ),
    (
        ENGINE + "INFO 11-30 13:02:19 [core.py:77] Initializing a V1 LLM engine (v0.16.0) with "
        "config: model='/models/Kimi-K2.5', speculative_config=None",
        Phase.ENGINE,
        None,
        'vllm/v1/engine/core.py: "Initializing a V1 LLM engine (v%s) with config: %s"',
    ),
    (
        ENGINE + "INFO 11-30 13:02:31 [gpu_model_runner.py:2602] Starting to load model "
        "/models/Kimi-K2.5...",
        Phase.LOADING,
        None,
        'vllm/v1/worker/gpu_model_runner.py: "Starting to load model %s..."',
    ),
    (
        "Loading safetensors checkpoint shards:   0% Completed | 0/64 [00:00<?, ?it/s]",
        Phase.LOADING,
        0,
        "vllm/model_executor/model_loader/weight_utils.py: _BAR_FORMAT = "
        '"{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, '
        '{rate_fmt}]\\n"',
    ),
    (
        "Loading safetensors checkpoint shards:  59% Completed | 38/64 [04:10<02:51,  6.59s/it]",
        Phase.LOADING,
        59,
        "same bar, later",
    ),
    (
        ENGINE + "INFO 11-30 13:09:40 [default_loader.py:267] Loading weights took 429.12 seconds",
        Phase.LOADED,
        None,
        'vllm/model_executor/model_loader/default_loader.py: "Loading weights took %.2f seconds"',
    ),
    (
        ENGINE + "INFO 11-30 13:09:41 [gpu_model_runner.py:2653] Model loading took 71.8844 GiB "
        "and 430.442057 seconds",
        Phase.LOADED,
        None,
        'vllm/v1/worker/gpu_model_runner.py: "Model loading took %.4f GiB and %.6f seconds"',
    ),
    (
        ENGINE + "INFO 11-30 13:09:50 [backends.py:559] Dynamo bytecode transform time: 8.29 s",
        Phase.COMPILING,
        None,
        'vllm/compilation/backends.py: "Dynamo bytecode transform time: %.2f s"',
    ),
    (
        ENGINE + "INFO 11-30 13:10:31 [monitor.py:34] torch.compile takes 49.29 s in total",
        Phase.COMPILING,
        None,
        'vllm/compilation/monitor.py: "torch.compile takes %.2f s in total"',
    ),
    (
        ENGINE + "INFO 11-30 13:10:58 [kv_cache_utils.py:1087] GPU KV cache size: 1,017,856 tokens",
        Phase.KV_CACHE,
        None,
        'vllm/v1/core/kv_cache_utils.py: "GPU KV cache size: %s tokens"',
    ),
    (
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  52%|█████▏    | 35/67 "
        "[00:06<00:05,  5.43it/s]",
        Phase.CUDA_GRAPHS,
        52,
        'vllm/v1/worker/gpu_model_runner.py: tqdm(desc="Capturing CUDA graphs ({mode}, '
        "{runtime_mode})\"), tqdm's default bar",
    ),
    (
        ENGINE + "INFO 11-30 13:11:20 [gpu_model_runner.py:3480] Graph capturing finished in 19 "
        "secs, took 0.53 GiB",
        Phase.ENGINE_READY,
        None,
        'vllm/v1/worker/gpu_model_runner.py: "Graph capturing finished in %.0f secs, took %.2f GiB"',  # noqa: E501 (a real capture, kept whole)
    ),
    (
        ENGINE + "INFO 11-30 13:11:20 [core.py:210] init engine (profile, create kv cache, warmup "
        "model) took 81.30 seconds",
        Phase.ENGINE_READY,
        None,
        'vllm/v1/engine/core.py: "init engine (profile, create kv cache, warmup model) took '
        '%.2f seconds"',
    ),
    (
        API + "INFO 11-30 13:11:24 [api_server.py:1915] Starting vLLM API server 0 on "
        "http://0.0.0.0:8000",
        Phase.API_STARTING,
        None,
        'vllm/entrypoints/openai/api_server.py: "Starting vLLM API server %d on %s"',
    ),
    (
        API + "INFO:     Application startup complete.",
        Phase.API_UP,
        None,
        'uvicorn/lifespan/on.py: "Application startup complete."',
    ),
]


@pytest.mark.parametrize(
    ("line", "phase", "percent", "source"),
    START_UP,
    ids=[f"{i}-{p.name}" for i, (_, p, _, _) in enumerate(START_UP)],
)
def test_each_start_up_line_names_its_phase(
    line: str, phase: Phase, percent: int | None, source: str
) -> None:
    seen = phase_of(line)
    assert seen is not None, source
    assert (seen[0], seen[1]) == (phase, percent), source
    assert failure_of(line) is None, source


def test_a_whole_start_walks_the_phases_in_order_and_shows_the_percentage() -> None:
    w = StartupWatch()
    shown = []
    for line, _, _, _ in START_UP:
        w.feed([line])
        shown.append(w.text())
    assert w.failure is None
    assert "loading weights 59 % (38/64)" in shown
    assert "capturing CUDA graphs 52 % (35/67)" in shown
    assert shown[-1] == "API server up"
    assert len(dict.fromkeys(shown)) >= 8


def test_a_late_line_of_an_earlier_phase_does_not_go_back() -> None:
    w = StartupWatch()
    w.feed([START_UP[12][0], START_UP[5][0]])  # graph capture done, then a shard line
    assert w.phase == Phase.ENGINE_READY


def test_a_carriage_return_progress_bar_shows_its_last_redraw() -> None:
    # tqdm's default redraws with "\r"; journald keeps them inside one entry.
    line = (
        "\rCapturing CUDA graph shapes:  10%|█         | 7/67 [00:01<00:12,  4.9it/s]"
        "\rCapturing CUDA graph shapes:  97%|█████████▋| 65/67 [00:13<00:00,  4.9it/s]\x1b[A"
    )
    assert clean(line).startswith("Capturing CUDA graph shapes:  97%")
    assert phase_of(clean(line)) == (Phase.CUDA_GRAPHS, 97, "65/67")


FAILURES: list[tuple[str, str, str]] = [
    (
        ENGINE + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 3 "
        "has a total capacity of 95.58 GiB of which 312.00 MiB is free.",
        "CUDA out of memory",
        'torch (c10/cuda/CUDACachingAllocator.cpp): "CUDA out of memory. Tried to allocate"',
    ),
    (
        ENGINE + "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for "
        "details)",
        "NCCL error",
        'vllm/distributed/device_communicators/pynccl_wrapper.py: f"NCCL error: {error_str}"',
    ),
    (
        ENGINE + "torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled cuda error",
        "NCCL error",
        'torch\'s c10d: "NCCL error in: <file>:<line>, <reason>"',
    ),
    (
        API + "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {}",
        "engine core initialization failed",
        'vllm/v1/engine/utils.py: "Engine core initialization failed. See root cause above."',
    ),
    (
        ENGINE + "Traceback (most recent call last):",
        "Python traceback",
        "CPython's traceback header",
    ),
]


@pytest.mark.parametrize(("line", "reason", "source"), FAILURES)
def test_failure_lines_end_the_wait(line: str, reason: str, source: str) -> None:
    assert failure_of(line) == reason, source


def test_the_shm_broadcast_warning_is_not_a_failure() -> None:
    # vllm/distributed/device_communicators/shm_broadcast.py: "No available shared memory
    # broadcast block found in %s seconds. This typically happens when some processes are
    # hanging or doing some time-consuming work (e.g. compilation, weight/kv cache
    # quantization)." Logged every 60 s while another worker compiles.
    line = (
        ENGINE + "INFO 11-30 13:10:31 [shm_broadcast.py:501] No available shared memory "
        "broadcast block found in 60 seconds. This typically happens when some processes "
        "are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
        "quantization)."
    )
    assert failure_of(line) is None
    w = StartupWatch()
    w.feed([START_UP[8][0], line, line, START_UP[10][0]])
    assert w.failure is None and w.phase == Phase.KV_CACHE


def test_an_oom_traceback_is_named_by_its_exception_with_its_lines() -> None:
    lines = [
        START_UP[5][0],
        ENGINE + "ERROR 11-30 13:04:02 [core.py:708] EngineCore failed to start.",
        ENGINE + "Traceback (most recent call last):",
        ENGINE + '  File "/opt/venvs/vllm/lib/python3.12/site-packages/vllm/v1/engine/core.py",'
        " line 699, in run_engine_core",
        ENGINE + "    engine_core = EngineCoreProc(*args, **kwargs)",
        FAILURES[0][0],
    ]
    w = StartupWatch()
    w.feed(lines[:2])  # the engine core's own line ends the wait ...
    assert w.failure is not None and w.failure.reason == "engine core initialization failed"
    w.feed(lines[2:])  # ... and the rest of it, read once more, names the cause
    failure = w.failure
    assert failure is not None and failure.reason == "CUDA out of memory"
    assert failure.lines[-1] == FAILURES[0][0]
    assert any("EngineCore failed to start." in ln for ln in failure.lines[:3])
    assert describe_failure(failure).startswith(
        "CUDA out of memory: (EngineCore_DP0 pid=48253) torch.OutOfMemoryError: CUDA out"
    )


def test_the_real_no_gpu_failure_is_a_traceback_named_by_its_last_exception() -> None:
    # Captured output of `vllm serve` on a host without a GPU (tests/samples/SOURCES.md).
    lines = (SAMPLES / "vllm_serve_no_gpu_0.33.0.log").read_text().splitlines()
    w = StartupWatch()
    w.feed(lines)
    failure = w.failure
    assert failure is not None and failure.reason == "Python traceback"
    assert describe_failure(failure).startswith(
        "Python traceback: RuntimeError: Failed to infer device type"
    )
    assert failure.lines[-1].startswith("RuntimeError: Failed to infer device type")


def test_the_watch_holds_a_bounded_number_of_lines() -> None:
    w = StartupWatch()
    w.feed([FAILURES[4][0]] + [f"  frame {i}" for i in range(100_000)])
    failure = w.failure
    # No context before here, so the head takes 15 lines: the header and 14 frames.
    assert failure is not None and len(failure.lines) == 15 + 1 + 30
    assert failure.lines[15] == f"… {100_000 - 14 - 30} lines not shown …"
    assert failure.lines[-1] == "  frame 99999"
    assert w.lines_seen == 100_001


def test_journalctl_show_cursor_output_splits_into_entries_and_cursor() -> None:
    out = "INFO:     Started server process [48213]\n-- cursor: s=7b1c;i=1d2e;b=9f;m=1a;t=5f;x=77\n"
    assert new_lines(out) == (
        ["INFO:     Started server process [48213]"],
        "s=7b1c;i=1d2e;b=9f;m=1a;t=5f;x=77",
    )
    assert new_lines("-- No entries --\n") == ([], None)


def test_progress_names_elapsed_time_and_the_median_of_previous_starts() -> None:
    assert progress_text("loading weights 60 %", 250.0) == "loading weights 60 % · 4m10s elapsed"
    history = StartHistory((400.0, 300.0, 1000.0))
    assert history.estimate_s == 400.0 and history.last_s == 400.0
    assert progress_text("API server up", 30, history) == (
        "API server up · 30s elapsed · usually ~6m40s (median of 3 starts)"
    )
    assert StartHistory().estimate_s is None


# ---- issue 17, D4: an exception in a thread that is not the main one -------------------------
# CPython's threading.excepthook (Lib/threading.py) writes "Exception in thread <name>:"
# then the traceback; the thread dies, the process goes on. The traceback is the shape of
# vllm-project/vllm issue #6340's (tests/test_real_vllm_samples.py builds it).


def thread_exc(prefix: str = "", last: str = PERMISSION) -> list[str]:
    return [*usage_thread_traceback(prefix)[:-1], prefix + last]


def test_a_thread_exception_is_a_warning_and_the_phases_go_on() -> None:
    w = StartupWatch()
    w.feed([START_UP[6][0], *thread_exc(ENGINE), START_UP[10][0], START_UP[-1][0]])
    assert w.failure is None
    assert w.phase == Phase.API_UP
    assert w.text() == (
        "API server up; warning: thread Thread-3 (_report_usage_worker) died: " + PERMISSION
    )
    assert thread_block(w).splitlines()[0] == (
        ENGINE + "Exception in thread Thread-3 (_report_usage_worker):"
    )
    assert thread_block(w).splitlines()[-1] == ENGINE + PERMISSION


def test_a_fatal_line_in_a_threads_traceback_still_ends_the_wait() -> None:
    # A CUDA OOM or an NCCL error is fatal whichever thread reports it.
    for last, reason in (
        (FAILURES[0][0][len(ENGINE) :], "CUDA out of memory"),
        (FAILURES[1][0][len(ENGINE) :], "NCCL error"),
    ):
        w = StartupWatch()
        w.feed(thread_exc(ENGINE, last))
        assert w.failure is not None and w.failure.reason == reason


def test_a_traceback_after_a_threads_is_the_main_process_failing() -> None:
    main = [
        ENGINE + "ERROR 11-30 13:04:02 [core.py:708] EngineCore failed to start.",
        ENGINE + "Traceback (most recent call last):",
        ENGINE + '  File "/opt/venvs/vllm/lib/python3.12/site-packages/vllm/v1/engine/'
        'core.py", line 699, in run_engine_core',
        FAILURES[0][0],
    ]
    w = StartupWatch()
    w.feed([*thread_exc(ENGINE), *main])
    assert w.failure is not None and w.failure.reason == "CUDA out of memory"
    # Straight after its exception line, with no line between, too.
    w = StartupWatch()
    w.feed([*thread_exc(ENGINE), *main[1:]])
    assert w.failure is not None
    # And one that starts inside the thread's frames without Python's chaining sentence.
    w = StartupWatch()
    w.feed([*thread_exc(ENGINE)[:6], *main[1:]])
    assert w.failure is not None
    # Whatever its exception: a traceback that names nothing fatal still ends the wait.
    plain = [
        ENGINE + "Traceback (most recent call last):",
        ENGINE + '  File "/opt/venvs/vllm/bin/vllm", line 5, in <module>',
        ENGINE + "ModuleNotFoundError: No module named 'vllm._C'",
    ]
    for before in (thread_exc(ENGINE), thread_exc(ENGINE)[:6]):
        w = StartupWatch()
        w.feed([*before, *plain])
        assert w.failure is not None and w.failure.reason == "Python traceback"
        assert describe_failure(w.failure).endswith("No module named 'vllm._C'")


def test_another_processes_traceback_between_the_threads_lines_is_a_failure() -> None:
    lines = thread_exc(ENGINE)
    w = StartupWatch()
    w.feed([*lines[:5], API + "Traceback (most recent call last):", *lines[5:]])
    assert w.failure is not None and w.failure.reason == "Python traceback"


def test_a_chained_exception_and_lines_of_other_threads_stay_the_threads() -> None:
    chained = [
        ENGINE + "Exception in thread Thread-7 (report_loop):",
        ENGINE + "Traceback (most recent call last):",
        ENGINE + '  File "/usr/lib/python3.12/socket.py", line 963, in getaddrinfo',
        ENGINE + "socket.gaierror: [Errno -3] Temporary failure in name resolution",
        ENGINE + "During handling of the above exception, another exception occurred:",
        ENGINE + "Traceback (most recent call last):",
        # a log line of the main thread, written meanwhile
        START_UP[10][0],
        ENGINE + '  File "/usr/lib/python3.12/threading.py", line 1075, in _bootstrap_inner',
        ENGINE + "urllib3.exceptions.MaxRetryError: HTTPSConnectionPool(host='stats.example',"
        " port=443): Max retries exceeded",
    ]
    w = StartupWatch()
    w.feed(chained)
    assert w.failure is None and w.phase == Phase.KV_CACHE
    (t,) = w.thread_exceptions
    assert t.thread == "Thread-7 (report_loop)"
    assert t.last.startswith("urllib3.exceptions.MaxRetryError: HTTPSConnectionPool")
    # uvicorn's "INFO:" is a log line, not the thread's exception line.
    w = StartupWatch()
    w.feed([*thread_exc()[:4], "INFO:     Started server process [48213]"])
    assert w.thread_exceptions[0].last == "" and w.phase == Phase.API_STARTING


def test_a_header_with_no_traceback_gives_up_and_a_later_traceback_fails() -> None:
    w = StartupWatch()
    w.feed(
        [
            ENGINE + "Exception in thread Thread-2:",
            *([ENGINE + "INFO 11-30 13:04:02 [core.py:90] waiting"] * 6),
            ENGINE + "Traceback (most recent call last):",
        ]
    )
    assert w.failure is not None and w.failure.reason == "Python traceback"
    assert w.thread_exceptions[0].thread == "Thread-2"


def test_a_threads_lines_and_the_threads_kept_are_bounded() -> None:
    w = StartupWatch()
    frames = [f"  frame {i}" for i in range(100_000)]
    w.feed(
        [
            "Exception in thread Thread-1:",
            "Traceback (most recent call last):",
            *frames,
            "OSError: [Errno 30] Read-only file system: '/home/vllm/.config/vllm'",
        ]
    )
    (t,) = w.thread_exceptions
    assert len(t.lines) == 1 + 1 + 12 and t.lines[1] == f"… {100_002 - 12} lines not shown …"
    assert t.last == "OSError: [Errno 30] Read-only file system: '/home/vllm/.config/vllm'"
    for i in range(20):
        w.feed(
            [
                f"Exception in thread Thread-{i + 2}:",
                "Traceback (most recent call last):",
                "  frame",
                "OSError: boom",
            ]
        )
    assert len(w.thread_exceptions) == 6  # five kept, and the one still open
    assert w.text().endswith("thread Thread-21 died: OSError: boom (and 20 other threads)")
    assert w.failure is None
