"""The /metrics and start-up journal parsers against the shapes of real vLLM output.

tests/test_metrics_readiness.py and tests/test_startup.py build their input from vLLM's
format strings. This file checks the parsers against what real servers printed, as
public captures show it (tests/samples/SOURCES.md, "vLLM output in public captures"):
the order of the messages, the lines a real log has between them (banners, warnings,
tracebacks that wrap tracebacks), journald's and Docker's prefixes, and metric families
that format strings do not show (``_created`` gauges, ``num_requests_waiting_by_reason``).

The captures themselves are not copied in: the search tool marks third-party text
"never copy it verbatim", and what ``fetch`` brings is not committed. So each line below
is written here, in the shape of the capture named beside it, with our own model names,
pids, paths, times and numbers; the fixed message texts are vLLM's, torch's and
systemd's. Where a whole capture was at hand it was first run through the parsers (the
copy was not kept): the failed start in the j33bs/clawd journal lost its root cause
before the fix in bot/core/startup.py, as its test here did.
"""

from __future__ import annotations

from bot.core.metrics import Load, parse_load
from bot.core.startup import Phase, StartupWatch, describe_failure, failure_of, phase_of

# ---- /metrics -----------------------------------------------------------------------------


def test_a_v1_scrape_without_engine_labels_reads_the_old_kv_name() -> None:
    """vllm-project/production-stack issue #318: a V1 server's /metrics (early 2025, HELP
    "Number of requests in model execution batches.") after prometheus_client's process_*
    families, labelled ``model_name`` only, KV-cache usage under its old name."""
    text = """\
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
process_open_fds 51.0
# HELP process_max_fds Maximum number of open file descriptors.
# TYPE process_max_fds gauge
process_max_fds 1.048576e+06
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="org/Coder-34B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="org/Coder-34B"} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="org/Coder-34B"} 0.125
# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries, in terms of number of queried blocks.
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="org/Coder-34B"} 4096.0
"""  # noqa: E501 - a real HELP line is as long as it is
    assert parse_load(text) == Load(2, 1, 0.125)


def test_created_gauges_and_both_kv_names_of_vllm_0_10() -> None:
    """vllm-project/production-stack issue #617 (vLLM 0.10.0): ``engine="0"`` labels, each
    counter's ``_created`` timestamp exposed as a gauge family of its own with its own
    HELP/TYPE, and a KV-cache usage near zero in exponent form. ai-dynamo's capture of
    vLLM 0.10.2 lists ``vllm:gpu_cache_usage_perc`` ("DEPRECATED: Use
    vllm:kv_cache_usage_perc instead") beside the new name: both carry the same value."""
    text = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="lab/GLM-9"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="lab/GLM-9"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="lab/GLM-9"} 3.5e-05
# HELP vllm:gpu_prefix_cache_queries_created GPU prefix cache queries, in terms of number of queried tokens. DEPRECATED: Use vllm:prefix_cache_queries instead.
# TYPE vllm:gpu_prefix_cache_queries_created gauge
vllm:gpu_prefix_cache_queries_created{engine="0",model_name="lab/GLM-9"} 1.7601234567e+09
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="lab/GLM-9"} 3.5e-05
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="lab/GLM-9"} 48.0
"""  # noqa: E501
    load = parse_load(text)
    assert load == Load(1, 0, 3.5e-05)
    assert load.describe() == "1 running, 0 waiting requests, KV cache 0 % used"


def test_waiting_by_reason_is_not_counted_twice() -> None:
    """Newer vLLM also publishes ``vllm:num_requests_waiting_by_reason`` (``reason=
    "capacity"`` / ``"deferred"``), a breakdown of the same waiting requests; public
    captures of live servers show it right after ``vllm:num_requests_waiting``, with
    a TYPE line and no HELP. A parser that matched names by prefix would read 4 here."""
    text = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen-mini"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen-mini"} 2.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="qwen-mini",reason="capacity"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="qwen-mini",reason="deferred"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen-mini"} 0.4
"""
    assert parse_load(text) == Load(3, 2, 0.4)


def test_a_current_v1_scrape_of_two_engines() -> None:
    """vLLM of 2026 (0.2x-0.3x): its ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py,
    read with ``find_string 'name="vllm:num_requests_waiting_by_reason"'``) registers
    ``num_requests_running``, ``num_requests_waiting``, ``num_requests_waiting_by_reason``
    (HELP "Number of waiting requests by reason. ... Sum of all reasons equals
    vllm:num_requests_waiting."), ``engine_sleep_state`` and ``kv_cache_usage_perc``, each
    labelled ``engine`` and ``model_name``; no ``vllm:gpu_cache_usage_perc`` any more.
    Public test fixtures quoting live servers of that time (SOURCES.md) show the samples
    in this order, two data-parallel engines, and the old names gone."""
    model = "lab/MoE-35B-A3B-FP4"
    text = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{model}"}} 6.0
vllm:num_requests_running{{engine="1",model_name="{model}"}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{model}"}} 2.0
vllm:num_requests_waiting{{engine="1",model_name="{model}"}} 0.0
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{engine="0",model_name="{model}",reason="capacity"}} 2.0
vllm:num_requests_waiting_by_reason{{engine="0",model_name="{model}",reason="deferred"}} 0.0
vllm:num_requests_waiting_by_reason{{engine="1",model_name="{model}",reason="capacity"}} 0.0
vllm:num_requests_waiting_by_reason{{engine="1",model_name="{model}",reason="deferred"}} 0.0
# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{{engine="0",model_name="{model}",sleep_state="awake"}} 1.0
vllm:engine_sleep_state{{engine="1",model_name="{model}",sleep_state="awake"}} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} 0.231717933836332
vllm:kv_cache_usage_perc{{engine="1",model_name="{model}"}} 0.0625
"""  # noqa: E501 - vLLM's HELP lines are as long as they are
    assert parse_load(text) == Load(9, 2, 0.231717933836332)


def test_a_hidden_name_shown_again_does_not_stand_in_for_the_current_one() -> None:
    """A server of the release after a rename, started with
    ``--show-hidden-metrics-for-version=<the release before>`` (vLLM's escape hatch: a
    metric deprecated in X.Y is hidden in X.Y+1 unless asked for, removed in X.Y+2; PR
    #15458, PR #29330), exports the hidden name again beside the current one. vLLM sets
    both from one value; the current name is what the server means, so the hidden one is
    read only where the current one is absent. (Values differ here to tell which name was
    read.)"""
    text = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""  # noqa: E501
    assert parse_load(text) == Load(0, 0, 0.25)
    old_only = "\n".join(ln for ln in text.splitlines() if "kv_cache_usage_perc{" not in ln)
    assert parse_load(old_only + "\n").kv_cache_usage == 0.5


def test_help_and_type_lines_without_samples_are_unknown_not_idle() -> None:
    """MeetKai/functionary PR #263 (a comment of 2024-10): a V0 server whose /metrics held
    the vllm: HELP and TYPE lines but no sample yet. Nothing is known, so the drain must
    not take the server for idle."""
    text = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
"""
    load = parse_load(text)
    assert load == Load(None, None, None)
    assert not load.known


# ---- the start-up journal ------------------------------------------------------------------

# The journal of a vllm.service as ``journalctl -o cat`` prints it (what the health gate
# reads): the message only. Shape: j33bs/clawd, workspace/audit/
# dali_vllm_singleton_guard_20260221T210005Z.md (commit a42ed14), the journal of a
# vLLM 0.15.1 system unit: one start that failed, then its restart that came up.
API = "(APIServer pid=4101) "
ENGINE = "(EngineCore_DP0 pid=4188) "
VENV = "/srv/vllm/venv/lib/python3.12/site-packages"


def _banner(pid_prefix: str) -> list[str]:
    # vLLM 0.15 prints its version in an ASCII banner, no "vLLM API server version" line.
    return [
        "Started vllm-chat.service - vLLM chat server.",
        f"{VENV}/transformers/utils/hub.py:110: FutureWarning: Using `TRANSFORMERS_CACHE` "
        "is deprecated and will be removed in v5 of Transformers. Use `HF_HOME` instead.",
        "  warnings.warn(",
        pid_prefix + "INFO 03-14 09:00:05 [utils.py:325]",
        pid_prefix + "INFO 03-14 09:00:05 [utils.py:325]  ▄▄ ▄█ █     █     █ ▀▄▀ █  "
        "version 0.15.1",
        pid_prefix + "INFO 03-14 09:00:05 [utils.py:261] non-default args: {'model_tag': "
        "'/srv/models/chat-13b', 'port': 8000, 'max_model_len': 32768}",
        pid_prefix + "INFO 03-14 09:00:05 [model.py:1561] Using max model len 32768",
        ENGINE + "INFO 03-14 09:00:09 [core.py:96] Initializing a V1 LLM engine (v0.15.1) "
        "with config: model='/srv/models/chat-13b', speculative_config=None",
        ENGINE + "INFO 03-14 09:00:10 [gpu_model_runner.py:4033] Starting to load model "
        "/srv/models/chat-13b...",
        ENGINE + "INFO 03-14 09:00:12 [cuda.py:364] Using FLASH_ATTN attention backend out "
        "of potential backends: ('FLASH_ATTN', 'FLASHINFER')",
        # vLLM's shard bar ends each redraw with "\n", so each is an entry of its own that
        # starts with tqdm's "\r" (journalctl's short output shows it as "[111B blob data]").
        "\rLoading safetensors checkpoint shards:   0% Completed | 0/3 [00:00<?, ?it/s]",
        "\rLoading safetensors checkpoint shards:  33% Completed | 1/3 [00:04<00:08,  4.10s/it]",
        "\rLoading safetensors checkpoint shards:  67% Completed | 2/3 [00:08<00:04,  4.05s/it]",
        "\rLoading safetensors checkpoint shards: 100% Completed | 3/3 [00:11<00:00,  3.71s/it]",
        ENGINE.rstrip(),  # the bare prefix line vLLM leaves after the bar
        ENGINE + "INFO 03-14 09:00:24 [default_loader.py:291] Loading weights took 11.42 seconds",
        ENGINE + "INFO 03-14 09:00:24 [gpu_model_runner.py:4130] Model loading took 24.61 GiB "
        "memory and 13.902117 seconds",
        ENGINE + "INFO 03-14 09:00:31 [backends.py:812] Using cache directory: /var/cache/vllm/"
        "torch_compile_cache/0a1b2c3d4e/rank_0_0/backbone for vLLM's torch.compile",
        ENGINE + "INFO 03-14 09:00:31 [backends.py:872] Dynamo bytecode transform time: 6.88 s",
        ENGINE + "INFO 03-14 09:00:38 [backends.py:267] Directly load the compiled graph(s) for "
        "compile range (1, 2048) from the cache, took 1.310 s",
        ENGINE + "INFO 03-14 09:00:38 [monitor.py:34] torch.compile takes 8.19 s in total",
    ]


def _failed_start() -> list[str]:
    """The failed start: the KV cache check raises in the engine core, whose traceback is
    logged twice (by vLLM's logger, then by multiprocessing), then the API server's own
    traceback wraps it. In the capture 62 lines come after the first root-cause line."""
    cause = (
        "ValueError: To serve at least one request with the models's max seq len "
        "(32768), (6.0 GiB KV cache is needed, which is larger than the available KV "
        "cache memory (2.41 GiB). Based on the available memory, the estimated maximum "
        "model length is 13152. Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine."
    )
    logged = ENGINE + "ERROR 03-14 09:00:39 [core.py:946] "

    def frames(prefix: str, n: int) -> list[str]:
        out = []
        for i in range(n):
            out += [
                f'{prefix}  File "{VENV}/vllm/v1/engine/core.py", line {100 + i}, in f{i}',
                f"{prefix}    step_{i}(",
                f"{prefix}    ^^^^^^^^^",
            ]
        return out

    return [
        *_banner(API),
        ENGINE + "INFO 03-14 09:00:39 [gpu_worker.py:356] Available KV cache memory: 2.41 GiB",
        logged + "EngineCore failed to start.",
        logged + "Traceback (most recent call last):",
        *frames(logged, 5),
        logged + "    raise ValueError(",
        logged + cause,
        ENGINE + "Process EngineCore_DP0:",
        ENGINE + "Traceback (most recent call last):",
        *frames(ENGINE, 7),
        ENGINE + "    raise ValueError(",
        ENGINE + cause,
        "[rank0]:[W314 09:00:39.123456789 ProcessGroupNCCL.cpp:1524] Warning: WARNING: "
        "destroy_process_group() was not called before program exit, which can leak "
        "resources. (function operator())",
        API + "Traceback (most recent call last):",
        *frames(API, 18),
        API + "    raise RuntimeError(",
        API + "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}",
        "vllm-chat.service: Main process exited, code=exited, status=1/FAILURE",
        "vllm-chat.service: Failed with result 'exit-code'.",
        "vllm-chat.service: Consumed 41.207s CPU time.",
    ]


def _good_start() -> list[str]:
    return [
        *_banner(API),
        ENGINE + "INFO 03-14 09:00:39 [gpu_worker.py:356] Available KV cache memory: 11.02 GiB",
        ENGINE + "INFO 03-14 09:00:39 [kv_cache_utils.py:1307] GPU KV cache size: 60,192 tokens",
        ENGINE + "INFO 03-14 09:00:39 [kv_cache_utils.py:1312] Maximum concurrency for 32,768 "
        "tokens per request: 1.84x",
        # tqdm's default bar redraws with "\r" and no newline: one entry, written at its end.
        "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          | 0/5 "
        "[00:00<?, ?it/s]\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|"
        "██████████| 5/5 [00:01<00:00,  4.21it/s]",
        # A torch warning during capture that names NCCL and is no failure (the shape of
        # baidu/vLLM-Kunlun PR #329's log).
        "[rank0]:[W314 09:00:41.000000001 CUDAGraph.cpp:137] Warning: Waiting for pending "
        "NCCL work to finish before starting graph capture. (function operator())",
        ENGINE + "INFO 03-14 09:00:42 [gpu_model_runner.py:5063] Graph capturing finished in "
        "2 secs, took 0.41 GiB",
        ENGINE + "INFO 03-14 09:00:42 [core.py:272] init engine (profile, create kv cache, "
        "warmup model) took 17.90 seconds",
        API + "INFO 03-14 09:00:43 [api_server.py:665] Supported tasks: ['generate']",
        API + "INFO 03-14 09:00:43 [api_server.py:946] Starting vLLM API server 0 on "
        "http://127.0.0.1:8000",
        API + "INFO 03-14 09:00:43 [launcher.py:38] Available routes are:",
        API + "INFO 03-14 09:00:43 [launcher.py:46] Route: /health, Methods: GET",
        API + "INFO:     Started server process [4101]",
        API + "INFO:     Waiting for application startup.",
        API + "INFO:     Application startup complete.",
    ]


def _phases(lines: list[str]) -> tuple[StartupWatch, list[str], list[Phase]]:
    """The watch fed line by line: each text the card would show and each phase, in order."""
    w = StartupWatch()
    shown: list[str] = []
    phases: list[Phase] = []
    for line in lines:
        w.feed([line])
        if not shown or shown[-1] != w.text():
            shown.append(w.text())
        if w.phase is not None and (not phases or phases[-1] != w.phase):
            phases.append(w.phase)
    return w, shown, phases


def test_a_journal_start_of_vllm_0_15_walks_every_phase_without_a_failure() -> None:
    """The restart in j33bs/clawd's journal, which came up: every phase in order, the
    shard bar's percentages, and no failure from its warnings."""
    w, shown, phases = _phases(_good_start())
    assert w.failure is None
    assert phases == list(Phase)  # all ten, STARTING to API_UP, none skipped or revisited
    assert "loading weights 67 % (2/3)" in shown
    assert "capturing CUDA graphs 100 % (5/5)" in shown
    assert shown[-1] == "API server up"
    assert w.phase == Phase.API_UP


def test_a_failed_start_names_the_root_cause_not_the_wrapper() -> None:
    """The failed start in j33bs/clawd's journal. The root cause is ~60 lines before the
    end, beyond the lines a failure keeps at its start and end; before the fix the summary
    was only vLLM's "See root cause above", and the cause was in no line kept."""
    w, _, _ = _phases(_failed_start())
    failure = w.failure
    assert failure is not None
    assert failure.reason == "engine core initialization failed"
    assert w.phase == Phase.KV_CACHE  # the last phase reached: "Available KV cache memory"
    summary = describe_failure(failure)
    assert summary.startswith(
        "engine core initialization failed: (EngineCore_DP0 pid=4188) "
        "ValueError: To serve at least one request"
    ), summary
    assert any("larger than the available KV cache memory" in ln for ln in failure.lines)
    assert failure.lines[-1] == "vllm-chat.service: Consumed 41.207s CPU time."
    assert len(failure.lines) <= 3 + 12 + 1 + 5 + 30  # still bounded


def test_an_oom_root_cause_names_the_failure_though_the_wrapper_ends_it() -> None:
    """A CUDA OOM in the engine core at start-up, wrapped the same way (vllm-project/vllm
    issue #19415 ends in "Engine core initialization failed"; noonghunna/club-3090 issues
    #16 and #58 show the same torch.OutOfMemoryError line while serving). The reason is
    the OOM, not the generic "engine core initialization failed"."""
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 "
        "has a total capacity of 23.56 GiB of which 18.12 MiB is free."
    )
    lines = [
        ln.replace(ln[ln.index("ValueError: To serve") :], oom)
        if "ValueError: To serve" in ln
        else ln
        for ln in _failed_start()
    ]
    w, _, _ = _phases(lines)
    failure = w.failure
    assert failure is not None and failure.reason == "CUDA out of memory"
    assert describe_failure(failure).startswith(
        "CUDA out of memory: (EngineCore_DP0 pid=4188) torch.OutOfMemoryError: CUDA out of "
        "memory. Tried to allocate 64.00 MiB"
    )


def test_cuda_errors_that_say_out_of_memory_are_an_oom() -> None:
    """noonghunna/club-3090 issue #60: a vLLM engine core failing with "RuntimeError: CUDA
    driver error: out of memory" (a custom op's allocation); "CUDA error: out of memory" is
    the runtime API's form of it."""
    driver = ENGINE + (
        "ERROR 03-14 09:00:39 [core.py:1136] RuntimeError: CUDA driver error: out of memory"
    )
    runtime = ENGINE + "RuntimeError: CUDA error: out of memory"
    assert failure_of(driver) == "CUDA out of memory"
    assert failure_of(runtime) == "CUDA out of memory"
    assert (
        failure_of(
            ENGINE + "INFO 03-14 09:00:18 [model_runner.py:1333] CUDA graphs can "
            "take additional 1~3 GiB memory per GPU. If you are running out of "
            "memory, consider decreasing `gpu_memory_utilization`"
        )
        is None
    )


def test_the_lines_of_vllm_0_21_and_later_name_their_phase() -> None:
    """Logs of 2026 vLLM (vllm-project/vllm PR #48214 and others): "torch.compile took" (it
    said "takes" before), CUDA graph memory profiled before the KV cache is sized and
    captured after, Docker's timestamp before each line, and an engine without _DP0."""
    engine = "2026-03-14T09:00:40.123456789Z (EngineCore pid=77) "
    lines = [
        engine + "INFO 03-14 09:00:40 [monitor.py:53] torch.compile took 21.04 s in total",
        engine + "INFO 03-14 09:00:52 [monitor.py:81] Initial profiling/warmup run took 11.52 s",
        engine + "INFO 03-14 09:00:53 [gpu_model_runner.py:6483] Profiling CUDA graph memory: "
        "PIECEWISE=51 (largest=512)",
        engine + "INFO 03-14 09:00:55 [gpu_worker.py:508] Available KV cache memory: 30.14 GiB",
        engine + "INFO 03-14 09:00:55 [kv_cache_utils.py:2395] GPU KV cache size: 424,112 "
        "tokens, Maximum concurrency for 32,768 tokens per request: 12.94x",
        "\rCapturing CUDA graphs (decode, FULL):  50%|█████     | 26/51 [00:03<00:03,  7.9it/s]",
        engine + "INFO 03-14 09:01:02 [gpu_model_runner.py:6656] Graph capturing finished in 7 "
        "secs, took 0.61 GiB",
        engine + "INFO 03-14 09:01:02 [gpu_worker.py:748] CUDA graph pool memory: 0.61 GiB "
        "(actual), 0.60 GiB (estimated), difference: 0.01 GiB (1.7%).",
    ]
    assert phase_of(lines[0]) == (Phase.COMPILING, None, "")
    # The warm-up and the CUDA graph memory profiling each size the KV cache (a release
    # may print one without the other).
    assert phase_of(lines[1]) == phase_of(lines[2]) == (Phase.KV_CACHE, None, "")
    _, shown, _ = _phases(lines)
    assert shown == [
        "torch.compile",
        "sizing the KV cache",
        "capturing CUDA graphs 50 % (26/51)",
        "engine initialised",
    ]


# ---- issue 17: vLLM 0.4-0.6 start-up phases (D9) --------------------------------------------

# A vLLM 0.5 start as `journalctl -o cat` prints it, in the shape of the 2024 logs in
# vllm-project/vllm issue #6545 and #4455 (the API server's "vLLM API server version" and
# "args: Namespace(...)" lines, 0.5.2 and 0.4.1), PR #5649 (2024-08-02, one GPU: "Using
# model weights format", the shard bar, "Loading model weights took 13.5083 GB", "# GPU
# blocks: 54775, # CPU blocks: 4096", "Capturing the model for CUDA graphs. ...", "CUDA
# graphs can take additional 1~3 GiB ...", "Graph capturing finished in 13 secs.") and PR
# #6234 (2024-07-17, tensor parallel: the same lines from "(VllmWorkerProcess pid=N)"),
# then uvicorn's own lines (uvicorn/server.py: "Started server process [%d]", "Waiting
# for application startup.", "Application startup complete.", "Uvicorn running on
# %s://%s:%d (Press CTRL+C to quit)"). V0's format has no "[" before the file name.
WORKER = "(VllmWorkerProcess pid=5312) "


def _v05_start() -> list[str]:
    return [
        "Started vllm-chat.service - vLLM chat server.",
        "INFO 07-18 10:00:01 api_server.py:212] vLLM API server version 0.5.3.post1",
        "INFO 07-18 10:00:01 api_server.py:213] args: Namespace(host=None, port=8000, "
        "uvicorn_log_level='info', model='/srv/models/chat-13b', tensor_parallel_size=2)",
        "INFO 07-18 10:00:02 llm_engine.py:174] Initializing an LLM engine (v0.5.3.post1) "
        "with config: model='/srv/models/chat-13b', speculative_config=None",
        WORKER + "INFO 07-18 10:00:09 multiproc_worker_utils.py:215] Worker ready; awaiting tasks",
        "INFO 07-18 10:00:11 weight_utils.py:224] Using model weights format ['*.safetensors']",
        "Loading safetensors checkpoint shards:   0% Completed | 0/6 [00:00<?, ?it/s]",
        "Loading safetensors checkpoint shards:  50% Completed | 3/6 [00:07<00:07,  2.41s/it]",
        "Loading safetensors checkpoint shards: 100% Completed | 6/6 [00:14<00:00,  2.38s/it]",
        WORKER + "INFO 07-18 10:00:26 model_runner.py:692] Loading model weights took 12.2415 GB",
        "INFO 07-18 10:00:26 model_runner.py:692] Loading model weights took 12.2415 GB",
        "INFO 07-18 10:00:31 distributed_gpu_executor.py:56] # GPU blocks: 21874, # CPU "
        "blocks: 2048",
        "INFO 07-18 10:00:33 model_runner.py:980] Capturing the model for CUDA graphs. This "
        "may lead to unexpected consequences if the model is not static. To run the model in "
        "eager mode, set 'enforce_eager=True' or use '--enforce-eager' in the CLI.",
        "INFO 07-18 10:00:33 model_runner.py:984] CUDA graphs can take additional 1~3 GiB "
        "memory per GPU. If you are running out of memory, consider decreasing "
        "`gpu_memory_utilization` or enforcing eager mode. You can also reduce the "
        "`max_num_seqs` as needed to decrease memory usage.",
        WORKER + "INFO 07-18 10:00:33 model_runner.py:980] Capturing the model for CUDA "
        "graphs. This may lead to unexpected consequences if the model is not static.",
        WORKER + "INFO 07-18 10:00:45 model_runner.py:1181] Graph capturing finished in 12 secs.",
        "INFO 07-18 10:00:45 model_runner.py:1181] Graph capturing finished in 12 secs.",
        "INFO 07-18 10:00:46 serving_chat.py:94] Using default chat template:",
        "INFO:     Started server process [5298]",
        "INFO:     Waiting for application startup.",
        "INFO:     Application startup complete.",
        "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)",
    ]


def test_a_vllm_0_5_start_walks_its_phases() -> None:
    """Before the fix, the weights, the KV cache sizing and the capture of 0.4-0.6 were not
    recognised: the card said "loading weights 100 %" from the shard bar until "engine
    initialised"."""
    w, shown, phases = _phases(_v05_start())
    assert w.failure is None
    assert phases == [
        Phase.STARTING,
        Phase.ENGINE,
        Phase.LOADING,
        Phase.LOADED,
        Phase.KV_CACHE,
        Phase.CUDA_GRAPHS,
        Phase.ENGINE_READY,
        Phase.API_STARTING,
        Phase.API_UP,
    ]
    assert "loading weights 50 % (3/6)" in shown
    assert shown[-1] == "API server up"
    lines = _v05_start()
    assert phase_of(lines[9]) == (Phase.LOADED, None, "")
    assert phase_of(lines[11]) == (Phase.KV_CACHE, None, "")
    assert phase_of(lines[12]) == (Phase.CUDA_GRAPHS, None, "")
    assert phase_of(lines[-4]) == (Phase.API_STARTING, None, "")
    assert phase_of(lines[-1]) == (Phase.API_UP, None, "")


def test_the_lines_of_vllm_0_6_and_the_later_v0_engine_name_their_phase() -> None:
    """vLLM 0.6.4 to 0.8 with the V0 engine (vllm-project/vllm PR #10909, 2024-12: "Memory
    profiling results: ...", "# GPU blocks"; PR #11349, 2024-12: "Capturing cudagraphs for
    decoding." and the "Capturing CUDA graph shapes" bar; SystemPanic/vllm-windows issue
    #6 and generative-computing/mellea PR #416: "# cuda blocks: N, # CPU blocks: M";
    kserve/kserve PR #4368: "Initializing a V0 LLM engine (v0.8.1)")."""
    lines = [
        (
            "INFO 12-13 02:09:02 llm_engine.py:249] Initializing a V0 LLM engine (v0.8.1) with "
            "config: model='/srv/models/chat-13b'",
            Phase.ENGINE,
        ),
        (
            "INFO 12-13 02:10:28 worker.py:237] Memory profiling results: duration=41.20 "
            "seconds, total_gpu_memory=79.15GiB, initial_memory_usage=14.33GiB",
            Phase.KV_CACHE,
        ),
        (
            "INFO 12-13 02:10:29 distributed_gpu_executor.py:58] # GPU blocks: 84512, # CPU "
            "blocks: 8192",
            Phase.KV_CACHE,
        ),
        (
            "INFO 04-04 17:58:00 [executor_base.py:111] # cuda blocks: 9120, # CPU blocks: 2048",
            Phase.KV_CACHE,
        ),
        (
            "INFO 12-19 22:58:27 model_runner.py:1415] Capturing cudagraphs for decoding. This "
            "may lead to unexpected consequences if the model is not static.",
            Phase.CUDA_GRAPHS,
        ),
        (
            "Capturing CUDA graph shapes:  40%|████      | 14/35 [00:05<00:08,  2.51it/s]",
            Phase.CUDA_GRAPHS,
        ),
        (
            "INFO 12-19 22:58:41 model_runner.py:1535] Graph capturing finished in 14 secs, took "
            "0.21 GiB",
            Phase.ENGINE_READY,
        ),
    ]
    for line, phase in lines:
        seen = phase_of(line)
        assert seen is not None and seen[0] == phase, line
        assert failure_of(line) is None, line
    assert phase_of(lines[5][0]) == (Phase.CUDA_GRAPHS, 40, "14/35")


# ---- issue 17: a thread's exception during a start (D4) -------------------------------------

# vllm-project/vllm issue #6340: vLLM's usage-stats thread dying while the server goes
# on. CPython's threading.excepthook prints "Exception in thread Thread-3
# (_report_usage_worker):" straight after a tqdm bar that has no newline yet, so the
# header shares the bar's line; then the traceback through threading.py's
# _bootstrap_inner and run into vllm/usage/usage_lib.py's _report_usage_worker,
# _report_usage_once and _write_to_file. Under systemd's ProtectHome= that last one fails
# at its first call, os.makedirs of ~/.config/vllm (usage_lib.py's source), which is the
# end written here: a PermissionError with our account's home.
USAGE_LIB = "/srv/vllm/venv/lib/python3.12/site-packages/vllm/usage/usage_lib.py"


def usage_thread_traceback(prefix: str = "", bar: str = "") -> list[str]:
    # vLLM writes its process prefix at the start of a line: a bar's "\r" redraws come
    # after it, and the header after the bar.
    return [
        f"{prefix}{bar}Exception in thread Thread-3 (_report_usage_worker):",
        f"{prefix}Traceback (most recent call last):",
        f'{prefix}  File "/usr/lib/python3.12/threading.py", line 1075, in _bootstrap_inner',
        f"{prefix}    self.run()",
        f'{prefix}  File "/usr/lib/python3.12/threading.py", line 1012, in run',
        f"{prefix}    self._target(*self._args, **self._kwargs)",
        f'{prefix}  File "{USAGE_LIB}", line 140, in _report_usage_worker',
        f"{prefix}    self._report_usage_once(model_architecture, usage_context, extra_kvs)",
        f'{prefix}  File "{USAGE_LIB}", line 179, in _report_usage_once',
        f"{prefix}    self._write_to_file(data)",
        f'{prefix}  File "{USAGE_LIB}", line 206, in _write_to_file',
        f"{prefix}    os.makedirs(os.path.dirname(_USAGE_STATS_JSON_PATH), exist_ok=True)",
        f'{prefix}  File "<frozen os>", line 215, in makedirs',
        f'{prefix}  File "<frozen os>", line 225, in makedirs',
        f"{prefix}PermissionError: [Errno 13] Permission denied: '/home/vllm'",
    ]


PERMISSION = "PermissionError: [Errno 13] Permission denied: '/home/vllm'"


def test_the_usage_stats_thread_dying_is_a_warning_and_the_start_goes_on() -> None:
    """Before the fix its "Traceback" ended the wait: "start-up failed: Python traceback"
    for a server that then served."""
    start = _good_start()
    at = start.index(next(ln for ln in start if "init engine" in ln)) + 1
    bar = "\rCapturing CUDA graphs (decode, FULL):  40%|████      | 2/5 [00:00<00:01,  4.02it/s]"
    lines = [*start[:at], *usage_thread_traceback(API, bar=bar), *start[at:]]
    w, shown, phases = _phases(lines)
    assert w.failure is None
    assert phases == list(Phase)
    assert w.text() == (
        f"API server up; warning: thread Thread-3 (_report_usage_worker) died: {PERMISSION}"
    )
    (thread,) = w.thread_exceptions
    assert thread.thread == "Thread-3 (_report_usage_worker)"
    assert thread.last == PERMISSION and thread.lines[-1] == API + PERMISSION
    # The bar's last redraw is the line as read (its prefix came before the "\r").
    assert thread.lines[0] == bar[1:] + "Exception in thread Thread-3 (_report_usage_worker):"
    assert "capturing CUDA graphs 40 % (2/5)" not in shown  # a late bar does not go back
    assert any("engine initialised; warning: thread Thread-3" in t for t in shown)


def test_the_same_traceback_without_the_thread_header_still_ends_the_wait() -> None:
    """The other way: a main-process traceback (the same lines, no "Exception in thread")
    is a failed start, as is one that follows a thread's."""
    start = _good_start()
    w, _, _ = _phases([*start[:20], *usage_thread_traceback(API)[1:]])
    assert w.failure is not None and w.failure.reason == "Python traceback"
    assert describe_failure(w.failure) == f"Python traceback: {API}{PERMISSION}"
    # A thread's traceback, then the main process's own: the second one ends the wait.
    main = [
        API + "Traceback (most recent call last):",
        API + f'  File "{VENV}/vllm/entrypoints/openai/api_server.py", line 1953, in run_server',
        API + "    async with build_async_engine_client(args) as engine_client:",
        API + "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}",
    ]
    w, _, _ = _phases([*start[:20], *usage_thread_traceback(API), *main])
    assert w.failure is not None and w.failure.reason == "engine core initialization failed"
    assert len(w.thread_exceptions) == 1


# ---- vLLM 0.30 (2026-09): the V1 engine's current lines --------------------------------------

# The shape of 2026 logs of current vLLM (SOURCES.md, "Current vLLM"): a report of the
# vllm-openai v0.30.0 image's start (found with find_string "Task C report: vLLM ladder on
# a Mokka vr200"): the version at the end of the ASCII banner, every API server line
# prefixed "(APIServer pid=N)", the engine core's "(EngineCore pid=N)" without _DP0, and a
# start that failed in the engine core; a 2026-08 log of the V2 model runner (found with
# find_string "Directly load the compiled graph(s) for"): "Using V2 Model Runner", "Loading
# model from scratch...", the shard bar after a bare prefix line, "Model loading took 0.93
# GiB and 2.17 seconds", the compile cache, "Initial profiling/warmup run took", "Capturing
# CUDA graphs (PIECEWISE)" and "(FULL)", "init engine ... took 5.07 s (compilation: 1.74 s)";
# a 2026-07 log with "Profiling CUDA graph memory" and "Estimated CUDA graph memory" before
# the KV cache is sized. Our pids, model, times and numbers.
API30 = "(APIServer pid=2311) "
ENGINE30 = "(EngineCore pid=2402) "
VENV30 = "/opt/vllm/venv/lib/python3.12/site-packages"


def _v030_banner() -> list[str]:
    return [
        API30 + "INFO 09-23 07:43:20 [api_utils.py:347]",
        API30 + "INFO 09-23 07:43:20 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.30.0",
        API30 + "INFO 09-23 07:43:20 [api_utils.py:286] non-default args: {'model_tag': "
        "'/srv/models/chat-8b', 'model': '/srv/models/chat-8b', 'max_model_len': 32768}",
        API30 + "INFO 09-23 07:43:35 [model.py:692] Resolved architecture: Qwen2ForCausalLM",
        API30 + "INFO 09-23 07:43:35 [scheduler.py:288] Chunked prefill is enabled with "
        "max_num_batched_tokens=16384.",
        ENGINE30 + "INFO 09-23 07:43:53 [core.py:123] Initializing a V1 LLM engine (v0.30.0) "
        "with config: model='/srv/models/chat-8b', dtype=torch.bfloat16",
    ]


def _v030_start() -> list[str]:
    return [
        *_v030_banner(),
        ENGINE30 + "INFO 09-23 07:43:54 [gpu_worker.py:378] Using V2 Model Runner",
        ENGINE30 + "INFO 09-23 07:43:54 [model_runner.py:284] Loading model from scratch...",
        ENGINE30.rstrip(),
        "\rLoading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]",
        "\rLoading safetensors checkpoint shards:  50% Completed | 1/2 [00:03<00:03,  3.40s/it]",
        "\rLoading safetensors checkpoint shards: 100% Completed | 2/2 [00:06<00:00,  3.12s/it]",
        ENGINE30.rstrip(),
        ENGINE30 + "INFO 09-23 07:44:01 [default_loader.py:430] Loading weights took 6.31 seconds",
        ENGINE30 + "INFO 09-23 07:44:01 [model_runner.py:305] Model loading took 15.26 GiB and "
        "7.402113 seconds",
        ENGINE30 + "INFO 09-23 07:44:03 [backends.py:1094] Using cache directory: /var/cache/"
        "vllm/torch_compile_cache/5e6f7a8b9c/rank_0_0/backbone for vLLM's torch.compile",
        ENGINE30 + "INFO 09-23 07:44:03 [backends.py:1155] Dynamo bytecode transform time: 2.04 s",
        ENGINE30 + "INFO 09-23 07:44:04 [backends.py:292] Directly load the compiled graph(s) "
        "for compile range (1, 16384) from the cache, took 0.811 s",
        ENGINE30 + "INFO 09-23 07:44:04 [monitor.py:53] torch.compile took 2.85 s in total",
        ENGINE30 + "INFO 09-23 07:44:19 [monitor.py:81] Initial profiling/warmup run took 14.92 s",
        ENGINE30 + "INFO 09-23 07:44:19 [gpu_model_runner.py:6568] Profiling CUDA graph memory: "
        "PIECEWISE=51 (largest=512), FULL=35 (largest=256)",
        ENGINE30 + "INFO 09-23 07:44:31 [gpu_model_runner.py:6654] Estimated CUDA graph memory: "
        "0.52 GiB total",
        ENGINE30 + "INFO 09-23 07:44:31 [gpu_worker.py:560] Available KV cache memory: 54.10 GiB",
        ENGINE30 + "INFO 09-23 07:44:31 [kv_cache_utils.py:2177] GPU KV cache size: 443,136 tokens",
        "\rCapturing CUDA graphs (PIECEWISE):  51%|█████     | 26/51 [00:01<00:01, 25.10it/s]"
        "\rCapturing CUDA graphs (PIECEWISE): 100%|██████████| 51/51 [00:02<00:00, 24.87it/s]",
        "\rCapturing CUDA graphs (FULL): 100%|██████████| 35/35 [00:01<00:00, 30.02it/s]",
        ENGINE30 + "INFO 09-23 07:44:35 [model_runner.py:747] Graph capturing finished in 4 "
        "secs, took 0.49 GiB",
        ENGINE30 + "INFO 09-23 07:44:35 [gpu_worker.py:741] CUDA graph pool memory: 0.49 GiB "
        "(actual), 0.52 GiB (estimated), difference: 0.03 GiB (6.1%).",
        ENGINE30 + "INFO 09-23 07:44:36 [core.py:340] init engine (profile, create kv cache, "
        "warmup model) took 42.87 s (compilation: 2.85 s)",
        API30 + "INFO 09-23 07:44:37 [api_server.py:598] Starting vLLM API server 0 on "
        "http://127.0.0.1:8000",
        API30 + "INFO 09-23 07:44:37 [launcher.py:46] Route: /v1/models, Methods: GET",
        API30 + "INFO:     Started server process [2311]",
        API30 + "INFO:     Waiting for application startup.",
        API30 + "INFO:     Application startup complete.",
    ]


def test_a_start_of_vllm_0_30_walks_every_phase() -> None:
    w, shown, phases = _phases(_v030_start())
    assert w.failure is None
    assert phases == list(Phase)
    # The first phase from the banner's version: no "vLLM API server version" line since 0.11.
    assert phase_of(_v030_start()[1]) == (Phase.STARTING, None, "")
    assert "loading weights 50 % (1/2)" in shown
    # The warm-up and CUDA graph memory profiling size the KV cache (14 s here, minutes on a
    # big model): not "torch.compile", which has finished.
    at_warmup = shown.index("sizing the KV cache")
    assert shown[at_warmup - 1] == "torch.compile"
    assert "capturing CUDA graphs 100 % (51/51)" in shown and shown[-1] == "API server up"


def test_a_failed_start_of_vllm_0_30_ends_the_wait_at_the_engine_cores_line() -> None:
    """The v0.30.0 image on a node whose GPUs CUDA cannot use: the engine core logs
    "EngineCore failed to start." (ERROR, core.py:1366) and its traceback, line by line
    with vLLM's prefix, to "RuntimeError: No CUDA GPUs are available"; then the API
    server's own traceback ends in "Engine core initialization failed. See root cause
    above." The wait ends at the engine core's first line; the cause is named."""
    logged = ENGINE30 + "ERROR 09-23 07:43:55 [core.py:1366] "
    lines = [
        *_v030_banner(),
        logged + "EngineCore failed to start.",
        logged + "Traceback (most recent call last):",
        logged + f'  File "{VENV30}/vllm/v1/worker/gpu_worker.py", line 424, in init_device',
        logged + "    torch.accelerator.set_device_index(self.device)",
        logged + f'  File "{VENV30}/torch/cuda/__init__.py", line 529, in _lazy_init',
        logged + "    torch._C._cuda_init()",
        logged + "RuntimeError: No CUDA GPUs are available",
        ENGINE30 + "RuntimeError: No CUDA GPUs are available",
        API30 + "Traceback (most recent call last):",
        API30 + f'  File "{VENV30}/vllm/v1/engine/utils.py", line 1320, in wait_for_engine_startup',
        API30 + "    raise RuntimeError(",
        API30 + "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}",
    ]
    first = len(_v030_banner()) + 1
    w = StartupWatch()
    w.feed(lines[:first])
    assert w.failure is not None and w.failure.reason == "engine core initialization failed"
    w.feed(lines[first:])
    failure = w.failure
    assert failure is not None
    assert describe_failure(failure) == (
        "engine core initialization failed: (EngineCore pid=2402) RuntimeError: No CUDA GPUs "
        "are available"
    )


def test_a_served_engines_fatal_error_is_the_engine_dying() -> None:
    """A 2026 V1 engine running out of memory while serving (a public report found with
    find_string "(APIServer pid="): the engine core's "EngineCore encountered a fatal
    error." (core.py:1110), its OOM, then the API server's EngineDeadError."""
    fatal = ENGINE30 + "ERROR 08-02 17:26:24 [core.py:1110] EngineCore encountered a fatal error."
    assert failure_of(fatal) == "engine dead"
    w = StartupWatch()
    w.feed(
        [
            fatal,
            ENGINE30 + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB.",
            API30 + "ERROR 08-02 17:26:24 [async_llm.py:704] vllm.v1.engine.exceptions."
            "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for "
            "the root cause.",
        ]
    )
    assert w.failure is not None and w.failure.reason == "CUDA out of memory"
