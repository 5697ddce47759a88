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


def _load_plan(st: HostState, run: Run, t0: float) -> list[JournalEntry]:
    """What vLLM logs from start until it serves, spread over load_delay_s (see
    ``since_start``)."""
    cfg, pid = st.config, run.main_pid
    version = module_version(run.version or "")  # vLLM logs its own __version__
    engine = f"(EngineCore_DP0 pid={pid + ENGINE_PID_OFFSET}) "
    worker = f"(Worker_TP0 pid={pid + WORKER_PID_OFFSET}) "
    steps: list[tuple[float, str, str, str]] = [
        (0.02, "", "__init__.py:216", "Automatically detected platform cuda."),
        (0.05, "", "api_server.py:1839", f"vLLM API server version {version}"),
        (
            0.06,
            "",
            "utils.py:253",
            f"non-default args: {{'model': '{cfg.model}', "
            f"'tensor_parallel_size': {cfg.gpus}, "
            f"'port': {st.service_port}}}",
        ),
        (
            0.10,
            engine,
            "core.py:93",
            f"Initializing a V1 LLM engine (v{version}) with config: model='{cfg.model}'",
        ),
        (
            _LOADING_FROM,
            worker,
            "gpu_model_runner.py:2653",
            f"Starting to load model {cfg.model}...",
        ),
    ]
    out = [_at(st, run, t0, f, prefix, src, text) for f, prefix, src, text in steps]
    for k in range(1, 5):
        f = _LOADING_FROM + 0.15 * k
        done = SHARDS * k // 4
        # vllm/model_executor/model_loader/weight_utils.py's _BAR_FORMAT.
        spent = f * cfg.load_delay_s
        out.append(
            JournalEntry(
                t0 + since_start(cfg, f),
                "python3",
                pid,
                f"{worker}Loading safetensors checkpoint shards: "
                f"{100 * k // 4:3d}% Completed | {done}/{SHARDS} "
                f"[{_clock(spent)}<{_clock(spent * (4 - k) / k)}, "
                f"{done / max(spent, 1e-3):6.2f}it/s]",
            )
        )
    out += _verbose(st, run, t0)
    t_ready = t0 + since_start(cfg, 1.0)
    out += [
        _at(
            st,
            run,
            t0,
            0.85,
            worker,
            "gpu_model_runner.py:2707",
            f"Model loading took {cfg.service_used_mib * 0.76 / 1024:.2f} GiB",
        ),
        *_warm_up(st, run, t0),
        _at(
            st,
            run,
            t0,
            0.95,
            engine,
            "kv_cache_utils.py:1087",
            "GPU KV cache size: 1,017,856 tokens",
        ),
        *_graphs(st, run, t0),
        *_usage_thread(st, run, t0),
        JournalEntry(
            t_ready,
            "python3",
            pid,
            vllm_line(
                t_ready,
                "INFO",
                "api_server.py:1024",
                f"Starting vLLM API server 0 on http://0.0.0.0:{st.service_port}",
            ),
        ),
        JournalEntry(t_ready, "python3", pid, f"INFO:     Started server process [{pid}]"),
        JournalEntry(t_ready, "python3", pid, "INFO:     Waiting for application startup."),
        JournalEntry(t_ready, "python3", pid, "INFO:     Application startup complete."),
    ]
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
    """torch.compile, between the weights and the KV cache (vllm/compilation/backends.py,
    vllm/compilation/monitor.py)."""
    engine = f"(EngineCore_DP0 pid={run.main_pid + ENGINE_PID_OFFSET}) "
    load = st.config.load_delay_s
    return [
        _at(
            st,
            run,
            t0,
            0.87,
            engine,
            "backends.py:559",
            f"Dynamo bytecode transform time: {0.02 * load:.2f} s",
        ),
        _at(
            st,
            run,
            t0,
            0.90,
            engine,
            "monitor.py:34",
            f"torch.compile takes {0.05 * load:.2f} s in total",
        ),
    ]


def _graphs(st: HostState, run: Run, t0: float) -> list[JournalEntry]:
    """CUDA graph capture (vllm/v1/worker/gpu_model_runner.py: a tqdm bar in its default
    format, then "Graph capturing finished"), and the engine's init time (core.py)."""
    engine = f"(EngineCore_DP0 pid={run.main_pid + ENGINE_PID_OFFSET}) "
    load, pid = st.config.load_delay_s, run.main_pid
    out = []
    for k, f in enumerate((0.96, 0.97, 0.98), 1):
        done = 67 * k // 3
        bar = ("█" * (10 * k // 3)).ljust(10)
        out.append(
            JournalEntry(
                t0 + since_start(st.config, f),
                "python3",
                pid,
                f"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): "
                f"{100 * k // 3:3d}%|{bar}| {done}/67 "
                f"[{_clock(0.01 * k * load)}<{_clock(0.01 * (3 - k) * load)}, "
                " 5.43it/s]",
            )
        )
    out += [
        _at(
            st,
            run,
            t0,
            0.985,
            engine,
            "gpu_model_runner.py:3480",
            f"Graph capturing finished in {max(round(0.03 * load), 1)} secs, took 0.53 GiB",
        ),
        _at(
            st,
            run,
            t0,
            0.99,
            engine,
            "core.py:210",
            f"init engine (profile, create kv cache, warmup model) took {0.99 * load:.2f} seconds",
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


def _oom(st: HostState, run: Run, plan: list[JournalEntry]) -> tuple[Run, list[JournalEntry]]:
    """oom_at_start: the engine runs out of GPU memory while loading and logs the
    traceback; the API server exits oom_exit_delay_s later, and never serves."""
    cfg = st.config
    assert run.started_at is not None
    at = run.started_at + since_start(cfg, cfg.oom_at)
    exit_at = at + cfg.oom_exit_delay_s
    pid, site = run.main_pid, f"{st.venv}/lib/python3.12/site-packages"
    engine = f"(EngineCore_DP0 pid={pid + ENGINE_PID_OFFSET}) "
    svc = service_name(cfg.unit)
    lines = [
        engine + vllm_line(at, "ERROR", "core.py:708", "EngineCore failed to start."),
        engine + "Traceback (most recent call last):",
        f'{engine}  File "{site}/vllm/v1/engine/core.py", line 699, in run_engine_core',
        f"{engine}    engine_core = EngineCoreProc(*args, **kwargs)",
        f'{engine}  File "{site}/vllm/v1/worker/gpu_model_runner.py", line 2635, in load_model',
        f"{engine}    self.model = model_loader.load_model(",
        f"{engine}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. "
        f"GPU {cfg.stuck_gpu} has a total capacity of 95.58 GiB of which 312.00 MiB is free. "
        "Including non-PyTorch memory, this process has 95.26 GiB memory in use.",
    ]
    crash = [JournalEntry(at, "python3", pid, line) for line in lines] + [
        JournalEntry(
            exit_at,
            "python3",
            pid,
            "RuntimeError: Engine core initialization "
            "failed. See root cause above. Failed core proc(s): {}",
        ),
        _systemd(exit_at, f"{svc}: Main process exited, code=exited, status=1/FAILURE"),
        _systemd(exit_at, f"{svc}: Failed with result 'exit-code'."),
    ]
    # It never serves: the port would open only after the exit.
    run = replace(run, fail_at=exit_at, ready_at=exit_at + 1.0)
    return run, [e for e in plan if e.ts < at] + crash


def _crash_plan(st: HostState, run: Run, at: float) -> list[JournalEntry]:
    pid, site = run.main_pid, f"{st.venv}/lib/python3.12/site-packages"
    svc = service_name(st.config.unit)
    if run.version is None:
        lines = [
            "Traceback (most recent call last):",
            f'  File "{st.venv}/bin/vllm", line 5, in <module>',
            "    from vllm.entrypoints.cli.main import main",
            "ModuleNotFoundError: No module named 'vllm'",
        ]
    else:
        engine = f"(EngineCore_DP0 pid={pid + ENGINE_PID_OFFSET}) "
        lines = [
            engine + vllm_line(at, "ERROR", "core.py:708", "EngineCore failed to start."),
            engine + "Traceback (most recent call last):",
            f'{engine}  File "{site}/vllm/v1/engine/core.py", line 699, in run_engine_core',
            f"{engine}    engine_core = EngineCoreProc(*args, **kwargs)",
            f'{engine}  File "{site}/vllm/v1/worker/gpu_worker.py", line 262, in load_model',
            f"{engine}    self.model_runner.load_model(eep_scale_up=eep_scale_up)",
            f"{engine}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. "
            f"GPU {st.config.stuck_gpu} has a total capacity of 95.58 GiB of which "
            "312.00 MiB is free.",
            "Traceback (most recent call last):",
            f'  File "{site}/vllm/entrypoints/openai/api_server.py", line 1953, in run_server',
            "    async with build_async_engine_client(args) as engine_client:",
            "RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}",
        ]
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
            py = [
                "INFO:     Shutting down",
                "INFO:     Waiting for application shutdown.",
                "INFO:     Application shutdown complete.",
                f"INFO:     Finished server process [{run.main_pid}]",
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
