"""The simulated unit's lifecycle: start, stop, reset-failed, and the journal each writes.

A start plans its whole future at once (load progress, "startup complete" or
the crash) as journal lines stamped in the future; readers only show lines up
to now, and a stop drops the ones that will no longer happen.
"""

from __future__ import annotations

import time
from dataclasses import replace

from bot.sim import vllm_server
from bot.sim.packages import cuda_problem, import_problem, module_version
from bot.sim.state import (
    ENGINE_PID_OFFSET,
    REMOVED_VALUE,
    REMOVED_VALUE_LEFT,
    WORKER_PID_OFFSET,
    HostConfig,
    HostState,
    JournalEntry,
    Run,
    StateStore,
    refused_flags,
    refused_value,
    replace_run,
    unit_args,
    unit_state,
    vllm_line,
)

PID_STEP = 1024  # pids of successive runs, like a busy host's
SHARDS = 64


def service_name(unit: str) -> str:
    return unit if unit.endswith(".service") else f"{unit}.service"


def is_ours(st: HostState, unit: str) -> bool:
    return service_name(unit) == service_name(st.config.unit)


def _systemd(ts: float, msg: str) -> JournalEntry:
    return JournalEntry(ts, "systemd", 1, msg)


systemd_line = _systemd


# Where the weights start loading, as a fraction of load_delay_s: the process starts
# (from 0) and the engine initialises (from half this) before it.
_LOADING_FROM = 0.2


def since_start(cfg: HostConfig, f: float) -> float:
    """Seconds from `systemctl start` to the point ``f`` (a fraction of load_delay_s) of a
    start: ``f * load_delay_s``, but each of the two phases before the weights load lasts
    at least startup_phase_min_s (the rest comes that much later)."""
    load = cfg.load_delay_s
    phase = max(_LOADING_FROM / 2 * load, cfg.startup_phase_min_s)
    if f <= _LOADING_FROM:
        return f / (_LOADING_FROM / 2) * phase
    return 2 * phase + (f - _LOADING_FROM) * load


def _prefixes(run: Run) -> tuple[str, str, str]:
    """What vLLM's V1 engine puts before each process's lines: the API server, the engine
    core (one data-parallel rank: ``_DP0``) and the first tensor-parallel worker."""
    pid = run.main_pid
    return (
        f"(APIServer pid={pid}) ",
        f"(EngineCore_DP0 pid={pid + ENGINE_PID_OFFSET}) ",
        f"(Worker_TP0 pid={pid + WORKER_PID_OFFSET}) ",
    )


def _banner(version: str, model: str) -> list[str]:
    """vLLM's ASCII banner (vllm/entrypoints/utils.py): since 0.11 the only line with its
    version; there is no "vLLM API server version" line any more."""
    return [
        "",
        "       █     █     █▄   ▄█",
        f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
        f"  █▄█▀ █     █     █     █  model   {model}",
        "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
        "",
    ]


def _load_plan(st: HostState, run: Run, t0: float) -> list[JournalEntry]:
    """What vLLM's V1 engine (0.3x) logs from start until it serves, spread over
    load_delay_s (see ``since_start``): each process's lines behind its prefix, as the
    2026 captures in tests/samples/SOURCES.md ("Current vLLM") show them."""
    cfg, pid = st.config, run.main_pid
    version = module_version(run.version or "")  # vLLM logs its own __version__
    api, engine, worker = _prefixes(run)
    steps: list[tuple[float, str, str, str]] = [
        *((0.05, api, "api_utils.py:347", line) for line in _banner(version, cfg.model)),
        (
            0.06,
            api,
            "api_utils.py:286",
            f"non-default args: {{'model_tag': '{cfg.model}', 'model': '{cfg.model}', "
            f"'tensor_parallel_size': {cfg.gpus}, 'port': {st.service_port}}}",
        ),
        (
            0.10,
            engine,
            "core.py:123",
            f"Initializing a V1 LLM engine (v{version}) with config: model='{cfg.model}'",
        ),
        (
            _LOADING_FROM,
            worker,
            "gpu_model_runner.py:4777",
            f"Starting to load model {cfg.model}...",
        ),
    ]
    out = [_at(st, run, t0, f, prefix, src, text) for f, prefix, src, text in steps]
    out += _shards(st, run, t0, worker)
    out += _verbose(st, run, t0)
    t_ready = t0 + since_start(cfg, 1.0)
    out += [
        _at(
            st,
            run,
            t0,
            0.85,
            worker,
            "default_loader.py:430",
            f"Loading weights took {0.6 * cfg.load_delay_s:.2f} seconds",
        ),
        _at(
            st,
            run,
            t0,
            0.855,
            worker,
            "gpu_model_runner.py:4879",
            f"Model loading took {cfg.service_used_mib * 0.76 / 1024:.2f} GiB memory and "
            f"{0.65 * cfg.load_delay_s:.6f} seconds",
        ),
        *_warm_up(st, run, t0),
        _at(
            st,
            run,
            t0,
            0.95,
            engine,
            "kv_cache_utils.py:2177",
            "GPU KV cache size: 1,017,856 tokens",
        ),
        *_graphs(st, run, t0),
        *_usage_thread(st, run, t0),
        *(
            JournalEntry(t_ready, "python3", pid, api + line)
            for line in (
                vllm_line(
                    t_ready,
                    "INFO",
                    "api_server.py:598",
                    f"Starting vLLM API server 0 on http://0.0.0.0:{st.service_port}",
                ),
                vllm_line(t_ready, "INFO", "launcher.py:46", "Route: /health, Methods: GET"),
                f"INFO:     Started server process [{pid}]",
                "INFO:     Waiting for application startup.",
                "INFO:     Application startup complete.",
            )
        ),
    ]
    return out


def _shards(st: HostState, run: Run, t0: float, worker: str) -> list[JournalEntry]:
    """The shard bar (vllm/model_executor/model_loader/weight_utils.py's _BAR_FORMAT): its
    own lines, each redraw ending in a newline, between bare prefix lines (the prefix is
    written before tqdm's carriage return)."""
    cfg, pid = st.config, run.main_pid
    out = [JournalEntry(t0 + since_start(cfg, _LOADING_FROM), "python3", pid, worker.rstrip())]
    for k in range(1, 5):
        f = _LOADING_FROM + 0.15 * k
        done = SHARDS * k // 4
        spent = f * cfg.load_delay_s
        out.append(
            JournalEntry(
                t0 + since_start(cfg, f),
                "python3",
                pid,
                f"Loading safetensors checkpoint shards: "
                f"{100 * k // 4:3d}% Completed | {done}/{SHARDS} "
                f"[{_clock(spent)}<{_clock(spent * (4 - k) / k)}, "
                f"{done / max(spent, 1e-3):6.2f}it/s]",
            )
        )
    out.append(JournalEntry(out[-1].ts, "python3", pid, worker.rstrip()))
    return out


def _clock(seconds: float) -> str:
    """tqdm's elapsed/remaining: ``MM:SS``."""
    s = int(seconds)
    return f"{s // 60:02d}:{s % 60:02d}"


def _at(
    st: HostState, run: Run, t0: float, f: float, prefix: str, source: str, text: str
) -> JournalEntry:
    ts = t0 + since_start(st.config, f)
    return JournalEntry(ts, "python3", run.main_pid, prefix + vllm_line(ts, "INFO", source, text))


def _warm_up(st: HostState, run: Run, t0: float) -> list[JournalEntry]:
    """torch.compile between the weights and the KV cache (vllm/compilation/backends.py,
    vllm/compilation/monitor.py: "took" since 2026), then the memory profiling that sizes
    the KV cache (a warm-up run, the CUDA graphs' memory)."""
    _, engine, worker = _prefixes(run)
    load = st.config.load_delay_s
    steps = [
        (
            0.86,
            worker,
            "backends.py:1094",
            f"Using cache directory: /home/{st.config.unit_user}/.cache/vllm/torch_compile_"
            "cache/5e6f7a8b9c/rank_0_0/backbone for vLLM's torch.compile",
        ),
        (0.87, worker, "backends.py:1155", f"Dynamo bytecode transform time: {0.02 * load:.2f} s"),
        (
            0.89,
            worker,
            "backends.py:330",
            f"Compiling a graph for compile range (1, 8192) takes {0.03 * load:.2f} s",
        ),
        (0.90, worker, "monitor.py:53", f"torch.compile took {0.05 * load:.2f} s in total"),
        (
            0.92,
            worker,
            "monitor.py:81",
            f"Initial profiling/warmup run took {0.02 * load:.2f} s",
        ),
        (
            0.93,
            worker,
            "gpu_model_runner.py:6568",
            "Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=35 (largest=256)",
        ),
        (0.94, engine, "gpu_worker.py:560", "Available KV cache memory: 54.10 GiB"),
    ]
    return [_at(st, run, t0, f, prefix, src, text) for f, prefix, src, text in steps]


def _graphs(st: HostState, run: Run, t0: float) -> list[JournalEntry]:
    """CUDA graph capture (vllm/v1/worker/gpu_model_runner.py: tqdm bars in their default
    format, one for the piecewise graphs and one for the full ones, then "Graph capturing
    finished"), and the engine's init time with its compilation share (core.py)."""
    _, engine, worker = _prefixes(run)
    load, pid = st.config.load_delay_s, run.main_pid
    out = []
    for k, f in enumerate((0.96, 0.97, 0.98), 1):
        done = 51 * k // 3
        bar = ("█" * (10 * k // 3)).ljust(10)
        out.append(
            JournalEntry(
                t0 + since_start(st.config, f),
                "python3",
                pid,
                f"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): "
                f"{100 * k // 3:3d}%|{bar}| {done}/51 "
                f"[{_clock(0.01 * k * load)}<{_clock(0.01 * (3 - k) * load)}, "
                " 5.43it/s]",
            )
        )
    out.append(
        JournalEntry(
            t0 + since_start(st.config, 0.982),
            "python3",
            pid,
            "Capturing CUDA graphs (decode, FULL): 100%|██████████| 35/35 "
            f"[{_clock(0.01 * load)}<00:00,  7.91it/s]",
        )
    )
    out += [
        _at(
            st,
            run,
            t0,
            0.985,
            worker,
            "gpu_model_runner.py:4977",
            f"Graph capturing finished in {max(round(0.03 * load), 1)} secs, took 0.53 GiB",
        ),
        _at(
            st,
            run,
            t0,
            0.99,
            engine,
            "core.py:340",
            f"init engine (profile, create kv cache, warmup model) took {0.99 * load:.2f} s "
            f"(compilation: {0.05 * load:.2f} s)",
        ),
    ]
    return out


def _usage_thread(st: HostState, run: Run, t0: float) -> list[JournalEntry]:
    """usage_thread_exception: vLLM's usage-stats thread (vllm/usage/usage_lib.py, started
    once the engine is up) dies because ~/.config/vllm cannot be made, as under systemd's
    ProtectHome=. CPython's threading.excepthook prints the header and the traceback; the
    server goes on. The shape of vllm-project/vllm issue #6340's traceback, with our paths
    and the os.makedirs frames _write_to_file runs first."""
    if not st.faults.usage_thread_exception:
        return []
    site = f"{st.venv}/lib/python3.12/site-packages/vllm/usage/usage_lib.py"
    lines = [
        "Exception in thread Thread-3 (_report_usage_worker):",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.12/threading.py", line 1075, in _bootstrap_inner',
        "    self.run()",
        '  File "/usr/lib/python3.12/threading.py", line 1012, in run',
        "    self._target(*self._args, **self._kwargs)",
        f'  File "{site}", line 140, in _report_usage_worker',
        "    self._report_usage_once(model_architecture, usage_context, extra_kvs)",
        f'  File "{site}", line 179, in _report_usage_once',
        "    self._write_to_file(data)",
        f'  File "{site}", line 206, in _write_to_file',
        "    os.makedirs(os.path.dirname(_USAGE_STATS_JSON_PATH), exist_ok=True)",
        '  File "<frozen os>", line 215, in makedirs',
        '  File "<frozen os>", line 225, in makedirs',
        f"PermissionError: [Errno 13] Permission denied: '/home/{st.config.unit_user}'",
    ]
    ts = t0 + since_start(st.config, 0.995)
    return [JournalEntry(ts, "python3", run.main_pid, line) for line in lines]


def _verbose(st: HostState, run: Run, t0: float) -> list[JournalEntry]:
    """startup_log_lines more lines while the weights load, as a verbose start logs."""
    n = st.config.startup_log_lines
    worker = f"(Worker_TP1 pid={run.main_pid + WORKER_PID_OFFSET + 1}) "
    return [
        _at(
            st,
            run,
            t0,
            0.3 + 0.5 * i / max(n, 1),
            worker,
            "custom_all_reduce.py:203",
            f"Registering {i} cuda graph addresses",
        )
        for i in range(n)
    ]


def _engine_failure(
    st: HostState, run: Run, at: float, cause: str, frame: str
) -> tuple[list[str], list[str]]:
    """An engine core failing to start, as vLLM 0.3x logs it (tests/samples/SOURCES.md,
    "Current vLLM": the v0.30.0 image's failed start): "EngineCore failed to start." and
    its traceback with vLLM's prefix on each line (core.py), the same traceback again from
    multiprocessing; then (the second list) the API server's own traceback ending in the
    wrapper."""
    site = f"{st.venv}/lib/python3.12/site-packages"
    api, engine, _ = _prefixes(run)
    logged = engine + vllm_line(at, "ERROR", "core.py:1366", "")
    frames = [
        f'  File "{site}/vllm/v1/engine/core.py", line 1357, in run_engine_core',
        "    engine_core = EngineCoreProc(*args, **kwargs)",
        f'  File "{site}/{frame}',
    ]
    return [
        logged + "EngineCore failed to start.",
        logged + "Traceback (most recent call last):",
        *(logged + line for line in frames),
        logged + cause,
        engine + "Process EngineCore_DP0:",
        engine + "Traceback (most recent call last):",
        *(engine + line for line in frames),
        engine + cause,
    ], [
        api + "Traceback (most recent call last):",
        api + f'  File "{site}/vllm/v1/engine/utils.py", line 1320, in wait_for_engine_startup',
        api + "    raise RuntimeError(",
        api + "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}",
    ]


def _oom(st: HostState, run: Run, plan: list[JournalEntry]) -> tuple[Run, list[JournalEntry]]:
    """oom_at_start: the engine runs out of GPU memory while loading and logs the
    traceback; the API server exits oom_exit_delay_s later, and never serves."""
    cfg = st.config
    assert run.started_at is not None
    at = run.started_at + since_start(cfg, cfg.oom_at)
    exit_at = at + cfg.oom_exit_delay_s
    svc = service_name(cfg.unit)
    core, wrapper = _engine_failure(
        st,
        run,
        at,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. "
        f"GPU {cfg.stuck_gpu} has a total capacity of 95.58 GiB of which 312.00 MiB is free. "
        "Including non-PyTorch memory, this process has 95.26 GiB memory in use.",
        'vllm/v1/worker/gpu_model_runner.py", line 4801, in load_model',
    )
    # The engine core's lines now; the API server's wrapper when it gives up and exits.
    crash = [JournalEntry(at, "python3", run.main_pid, line) for line in core] + [
        JournalEntry(exit_at, "python3", run.main_pid, line) for line in wrapper
    ]
    crash += [
        _systemd(exit_at, f"{svc}: Main process exited, code=exited, status=1/FAILURE"),
        _systemd(exit_at, f"{svc}: Failed with result 'exit-code'."),
    ]
    # It never serves: the port would open only after the exit.
    run = replace(run, fail_at=exit_at, ready_at=exit_at + 1.0)
    return run, [e for e in plan if e.ts < at] + crash


def _crash_plan(st: HostState, run: Run, at: float) -> list[JournalEntry]:
    pid = run.main_pid
    svc = service_name(st.config.unit)
    if run.version is None:
        lines = [
            "Traceback (most recent call last):",
            f'  File "{st.venv}/bin/vllm", line 5, in <module>',
            "    from vllm.entrypoints.cli.main import main",
            "ModuleNotFoundError: No module named 'vllm'",
        ]
    else:
        core, wrapper = _engine_failure(
            st,
            run,
            at,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. "
            f"GPU {st.config.stuck_gpu} has a total capacity of 95.58 GiB of which "
            "312.00 MiB is free.",
            'vllm/v1/worker/gpu_worker.py", line 262, in load_model',
        )
        lines = core + wrapper
    return [JournalEntry(at, "python3", pid, line) for line in lines] + [
        _systemd(at, f"{svc}: Main process exited, code=exited, status=1/FAILURE"),
        _systemd(at, f"{svc}: Failed with result 'exit-code'."),
    ]


def _usage_error(
    st: HostState, run: Run, at: float, refused: tuple[str, ...]
) -> list[JournalEntry]:
    """A flag the build does not know, or a value it does not list: argparse prints its
    usage and exits 2 before anything loads (its words: tests/samples/vllm_help/
    serve_parse_0.10.2.txt)."""
    svc = service_name(st.config.unit)
    flag, value = REMOVED_VALUE
    if f"{flag}={value}" in refused:
        left = ", ".join(f"'{v}'" for v in REMOVED_VALUE_LEFT)
        error = f"argument {flag}: invalid choice: '{value}' (choose from {left})"
    else:
        args = unit_args(st)
        error = "unrecognized arguments: " + " ".join(
            w for f in refused for w in (f, *_value_after(args, f))
        )
    lines = ["usage: vllm serve [model_tag] [options]", f"vllm serve: error: {error}"]
    return [JournalEntry(at, "vllm", run.main_pid, line) for line in lines] + [
        _systemd(at, f"{svc}: Main process exited, code=exited, status=2/INVALIDARGUMENT"),
        _systemd(at, f"{svc}: Failed with result 'exit-code'."),
    ]


def _value_after(flags: tuple[str, ...], flag: str) -> tuple[str, ...]:
    i = flags.index(flag) + 1
    return (flags[i],) if i < len(flags) and not flags[i].startswith("-") else ()


def _engine_death(st: HostState, run: Run, at: float) -> list[JournalEntry]:
    """A served engine dying, as vLLM logs it (tests/samples/SOURCES.md: vllm#44281,
    vllm-metal#112): the API server's output handler fails with EngineDeadError, then
    the process exits and systemd marks the unit failed."""
    pid, svc = run.main_pid, service_name(st.config.unit)
    api = f"(APIServer pid={pid}) "
    where = "v1/engine/async_llm.py:704"
    lines = [
        api + vllm_line(at, "ERROR", where, "AsyncLLM output_handler failed."),
        api + vllm_line(at, "ERROR", where, "Traceback (most recent call last):"),
        api
        + vllm_line(
            at,
            "ERROR",
            where,
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.",
        ),
    ]
    return [JournalEntry(at, "python3", pid, line) for line in lines] + [
        _systemd(at, f"{svc}: Main process exited, code=exited, status=1/FAILURE"),
        _systemd(at, f"{svc}: Failed with result 'exit-code'."),
    ]


def _begin(st: HostState, t0: float, *, may_fail: bool) -> tuple[HostState, list[JournalEntry]]:
    cfg = st.config
    version = st.installed_version
    # A venv that cannot import vllm, or a torch the driver is too old for, crashes too.
    broken = import_problem(st) is not None or cuda_problem(st) is not None
    refused = refused_flags(st, version) if may_fail else ()
    if may_fail and refused_value(st, version):
        refused = (*refused, f"{REMOVED_VALUE[0]}={REMOVED_VALUE[1]}")
    fails = may_fail and (version is None or st.faults.start_fails or broken or bool(refused))
    run = Run(
        generation=st.run.generation + 1,
        main_pid=st.next_pid,
        version=version,
        started_at=t0,
        ready_at=t0 + since_start(cfg, 1.0),
        fail_at=t0 + cfg.fail_delay_s if fails else None,
    )
    plan = [_systemd(t0, f"Started {service_name(cfg.unit)} - {cfg.description}.")]
    plan += _load_plan(st, run, t0)
    if refused:
        plan = plan[:1] + _usage_error(st, run, t0 + cfg.fail_delay_s, refused)
    elif run.fail_at is not None:
        plan = [e for e in plan if e.ts < run.fail_at] + _crash_plan(st, run, run.fail_at)
    elif may_fail and st.faults.oom_at_start:
        run, plan = _oom(st, run, plan)
    elif may_fail and st.faults.engine_dies_after_ready and version != st.boot_version:
        assert run.ready_at is not None
        dies_at = run.ready_at + cfg.die_after_ready_s
        run = replace(run, fail_at=dies_at)
        plan = [e for e in plan if e.ts < dies_at] + _engine_death(st, run, dies_at)
    return replace(st, run=run, next_pid=st.next_pid + PID_STEP), plan


def boot(store: StateStore, *, uptime_s: float = 7200.0) -> None:
    """Bring the host up with the service already running for a while."""
    with store.transaction() as tx:
        tx.state, plan = _begin(tx.state, time.time() - uptime_s, may_fail=False)
        tx.journal_add(plan)
        generation = tx.state.run.generation
    vllm_server.spawn(store.directory, generation)


def start_at_boot(st: HostState, t0: float) -> tuple[HostState, list[JournalEntry]]:
    """The enabled unit starting as the host boots at ``t0`` (bot.sim.power): a start
    like ``systemctl start``'s, which fails the same ways; the caller spawns its server."""
    return _begin(st, t0, may_fail=True)


def start(store: StateStore) -> None:
    _finish_stop(store)
    with store.transaction() as tx:
        if unit_state(tx.state.run, time.time())[0] == "active":
            return
        tx.state, plan = _begin(tx.state, time.time(), may_fail=True)
        tx.journal_add(plan)
        generation = tx.state.run.generation
    # Spawned after the lock is released: a stop racing in makes the server exit by itself.
    vllm_server.spawn(store.directory, generation)


def _finish_stop(store: StateStore) -> None:
    """Block while a stop is in progress, as systemctl waits for the stop job."""
    run = store.read().run
    if unit_state(run, time.time())[0] == "deactivating":
        assert run.stopped_at is not None
        time.sleep(max(0.0, run.stopped_at - time.time()))


def stop(store: StateStore) -> None:
    now = time.time()
    with store.transaction() as tx:
        st, cfg = tx.state, tx.state.config
        run, svc = st.run, service_name(cfg.unit)
        if unit_state(run, now)[0] == "active":
            end = now + cfg.stop_delay_s
            tx.journal_drop_after(now)
            step = cfg.stop_delay_s / 5
            api = _prefixes(run)[0]
            py = [
                api + "INFO:     Shutting down",
                api + "INFO:     Waiting for application shutdown.",
                api + "INFO:     Application shutdown complete.",
                api + f"INFO:     Finished server process [{run.main_pid}]",
            ]
            plan = [_systemd(now, f"Stopping {svc} - {cfg.description}...")]
            plan += [
                JournalEntry(now + (k + 1) * step, "python3", run.main_pid, line)
                for k, line in enumerate(py)
            ]
            if st.faults.stuck_worker:
                stuck = run.main_pid + WORKER_PID_OFFSET + cfg.stuck_gpu
                plan.append(
                    _systemd(
                        end,
                        f"{svc}: Unit process {stuck} "
                        f"(VLLM::Worker_TP{cfg.stuck_gpu}) remains running "
                        "after unit stopped.",
                    )
                )
            plan += [
                _systemd(end, f"{svc}: Deactivated successfully."),
                _systemd(end, f"Stopped {svc} - {cfg.description}."),
            ]
            tx.journal_add(plan)
            tx.state = replace_run(st, stopped_at=end, fail_at=None)
    vllm_server.stop_all(store.directory)
    _finish_stop(store)


def reset_failed(store: StateStore) -> None:
    with store.transaction() as tx:
        run = tx.state.run
        if unit_state(run, time.time())[0] == "failed":
            tx.state = replace_run(tx.state, stopped_at=run.fail_at, fail_at=None)
