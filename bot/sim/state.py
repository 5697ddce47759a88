"""The shared state of one simulated host, and what the host looks like at a given moment.

Every simulated tool is its own short-lived process, so the state lives in a
directory: ``state.json`` (replaced atomically), ``journal.jsonl`` and
``calls.jsonl``, all guarded by ``flock`` on ``lock``.  Nothing runs in the
background to move the host along: each change stores wall-clock timestamps
(when the model will be loaded, when a crash happens, when memory is freed)
and every reader derives the current picture from them, so a test sees the
same host whichever tool it asks and however slowly the machine runs.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import math
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

STATE_DIR_ENV = "SIM_STATE_DIR"
# The flags the unit passes `vllm serve` beyond the model, the GPUs and the port.
UNIT_FLAGS = ("--served-model-name", "kimi-k2.5", "--task", "generate")
DEFAULT_VERSION = "0.31.0rc2.dev313+g662205d34"
FIRST_PID = 48213
WORKER_PID_OFFSET = 88  # Worker_TP<i> runs as main_pid + 88 + i
ENGINE_PID_OFFSET = 40
CONTEXT_MIB = 14  # what the driver itself holds on a GPU beyond the processes' share
STUCK_GPU = 3


@dataclass(frozen=True, slots=True)
class HostConfig:
    """The knobs of one simulated host. Durations are seconds of wall-clock time."""

    hostname: str = "gpu-node-1"
    unit: str = "vllm-kimi-k25"
    description: str = "vLLM Kimi-K2.5 (INT4)"
    model: str = "/models/Kimi-K2.5"
    gpus: int = 8
    gpu_name: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    gpu_total_mib: int = 97871
    service_used_mib: int = 97000
    stuck_worker_mib: int = 96000
    # After the unit is inactive, workers stay listed and memory stays used this long.
    release_delay_s: float = 2.0
    # From `systemctl start` until the port answers.
    load_delay_s: float = 5.0
    # Each of the two start-up phases before the weights load (the process starting, the
    # engine initialising: a tenth of load_delay_s each) lasts at least this long; the
    # start takes what they were stretched by longer. For a test that must see each phase
    # however slowly a loaded machine polls, without a long load.
    startup_phase_min_s: float = 0.0
    # With start_fails: from `systemctl start` until the unit is `failed`.
    fail_delay_s: float = 1.0
    # `systemctl stop` blocks this long (deactivating) before the unit is inactive.
    stop_delay_s: float = 0.5
    install_duration_s: float = 4.0
    # Extra `Downloading`/build-log lines an install prints (benchmarks use 100..100,000).
    install_output_lines: int = 0
    # With uv_floods: the length of the one line without a newline an install prints.
    flood_chars: int = 300 * 1024 * 1024
    available_versions: tuple[str, ...] = ("0.30.0", "0.31.0", DEFAULT_VERSION)
    latest_version: str = "0.31.0"
    # A private index (credentials in its URL) and the versions only it has: uv finds
    # them only when given exactly this URL (flag or UV_INDEX_URL / UV_EXTRA_INDEX_URL).
    index_url: str = ""
    index_versions: tuple[str, ...] = ()
    # The API: the model id /v1/models lists, and what a completion answers.
    served_model: str = "kimi-k2.5"
    completion_text: str = " Paris. It is also the largest city in France."
    # The API faults (wrong_model, smoke_fail, smoke_empty) hit only a build other than the
    # one the host booted with, as a bad release does: the rollback serves again. Off, they
    # hit every build (a restart of the running one included).
    api_faults_new_build_only: bool = False
    # busy: requests in flight when the fault is set, all finished busy_drain_s later.
    busy_running: int = 4
    busy_waiting: int = 2
    busy_drain_s: float = 3.0
    # oom_at_start: the CUDA OOM traceback comes at this fraction of load_delay_s, and the
    # process exits oom_exit_delay_s after it (the API server waits for its engine).
    oom_at: float = 0.4
    oom_exit_delay_s: float = 30.0
    # engine_dies_after_ready: the new build's engine dies this long after it is ready
    # (EngineDeadError in the journal, the process exits, the unit goes failed).
    die_after_ready_s: float = 60.0
    # engine_hangs_after_ready: completions hang from this long after ready; each one is
    # held engine_hang_s, then dropped unanswered; /health stays 200.
    hang_after_ready_s: float = 60.0
    engine_hang_s: float = 5.0
    # Extra journal lines a start logs while loading (a verbose start-up).
    startup_log_lines: int = 0
    # The highest CUDA the driver supports (nvidia-smi's header: R590 reports 13.1), and
    # what it says with the torch_cuda_mismatch fault: a 12.x driver (R575 reports 12.9),
    # on which the host's cu129 build runs and PyPI's CUDA 13 torch cannot.
    driver_cuda: str = "13.1"
    old_driver_cuda: str = "12.9"
    # What a wheel not in uv's cache costs to fetch: MiB per second (0: no cost) and a
    # fixed delay per wheel (connection, redirect, index page).
    download_mib_per_s: float = 0.0
    download_delay_s: float = 0.0
    # Issue 12. The account the unit runs as (systemctl show -p User).
    unit_user: str = "vllm"
    # A second vLLM service on this host, on these GPUs (the unit's are the others):
    # always serving, never touched by the unit's start or stop. Empty: none.
    neighbour_unit: str = ""
    neighbour_gpus: tuple[int, ...] = ()
    neighbour_used_mib: int = 90000
    # Issue 20. The flags the unit passes `vllm serve` beyond the model, the GPUs and the
    # port (ExecStart in `systemctl show`); with the removed_flag fault, no build but the
    # one the host booted with accepts `--task`. A wrapper: ExecStart runs this command
    # instead of `vllm serve` (a script whose flags cannot be checked).
    unit_flags: tuple[str, ...] = UNIT_FLAGS
    exec_wrapper: tuple[str, ...] = ()
    # The unit's Environment= assignments ("NAME=value", a value may hold spaces) and its
    # EnvironmentFile= paths (a `-` before one: ignore_errors), which unit_flags may name
    # as `$NAME` or `${NAME}`: `systemctl show` prints both as systemd does, and a start
    # expands them (a file is read from this machine's file system).
    unit_environment: tuple[str, ...] = ()
    unit_env_files: tuple[str, ...] = ()
    # Issue 23, host maintenance. `systemctl reboot`: the host is down (every SSH login
    # drops) this long, then comes up and starts its enabled units (bot.sim.power); with
    # the reboot_slow fault, reboot_slow_s instead.
    reboot_delay_s: float = 30.0
    reboot_slow_s: float = 600.0
    # `nvidia-smi -r -i N` takes this long when it succeeds (1-2 s on real hardware).
    gpu_reset_s: float = 1.5
    # Persistence mode of every GPU after a boot (nvidia-persistenced turns it on).
    persistence_at_boot: bool = True

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("gpus must be at least 1")
        if not 0 <= self.service_used_mib <= self.gpu_total_mib:
            raise ValueError("service_used_mib must be between 0 and gpu_total_mib")
        if not 0 <= self.stuck_worker_mib <= self.gpu_total_mib:
            raise ValueError("stuck_worker_mib must be between 0 and gpu_total_mib")
        for name in (
            "release_delay_s",
            "load_delay_s",
            "startup_phase_min_s",
            "fail_delay_s",
            "die_after_ready_s",
            "hang_after_ready_s",
            "engine_hang_s",
            "stop_delay_s",
            "install_duration_s",
            "install_output_lines",
            "flood_chars",
            "download_mib_per_s",
            "download_delay_s",
            "reboot_delay_s",
            "reboot_slow_s",
            "gpu_reset_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.latest_version not in self.available_versions:
            raise ValueError("latest_version must be one of available_versions")
        if self.index_versions and not self.index_url:
            raise ValueError("index_versions need an index_url")

    @property
    def stuck_gpu(self) -> int:
        return min(STUCK_GPU, self.gpus - 1)


@dataclass(frozen=True, slots=True)
class Faults:
    """Fault switches; tests flip them at any time through ``SimKit.set_faults``."""

    stuck_worker: bool = False  # after stop, Worker_TP3 survives holding ~96 GB, forever
    # The next real install into the venv fails (download error), then clears. The bot's
    # prefetch (an install into a throwaway venv) is spared: see prefetch_fails.
    uv_fails: bool = False
    uv_fails_always: bool = False  # every real install fails, rollbacks included
    prefetch_fails: bool = False  # the next prefetch fails downloading, then clears
    uv_stalls: bool = False  # real installs stall after resolving while this is set
    # Real installs first print one line of flood_chars characters (a runaway progress
    # bar, `tr '\0' C </dev/zero`), then go on as usual.
    uv_floods: bool = False
    resolve_fails: bool = False  # every install and dry run fails to resolve
    health_503: bool = False  # the loaded server answers /health with 503
    start_fails: bool = False  # a start crashes with a traceback shortly after
    no_driver: bool = False  # nvidia-smi cannot talk to the driver
    wrong_model: bool = False  # /v1/models lists another model than served_model
    smoke_fail: bool = False  # /v1/completions answers 500 with vLLM's error JSON
    smoke_empty: bool = False  # /v1/completions answers 200 with an empty text
    # Requests in flight (busy_running + busy_waiting), finishing over busy_drain_s from
    # when the fault is set.
    busy: bool = False
    # A start logs a CUDA OOM traceback while loading, then exits oom_exit_delay_s later.
    oom_at_start: bool = False
    # Issue 20: a build other than the one the host booted with serves, then its engine
    # dies die_after_ready_s after it is ready (the watch window must catch it; the
    # rollback's build does not die).
    engine_dies_after_ready: bool = False
    # Issue 20: /health stays 200 but completions hang (the engine is hung) from
    # hang_after_ready_s after ready; with api_faults_new_build_only, the new build only.
    engine_hangs_after_ready: bool = False
    # Issue 10. The driver supports only old_driver_cuda, older than the CUDA the new
    # release's torch is built for: that torch cannot start on this host.
    torch_cuda_mismatch: bool = False
    # `import vllm` fails for any vllm but the one the host booted with (a wheel built
    # against another torch: undefined symbol in vllm/_C.abi3.so).
    import_error: bool = False
    # Issue 20. The same failed import, but caused by a package the install leaves alone
    # in the service's venv (a vLLM plugin built for the old release): the prefetch's
    # throwaway venv holds only the install's set, so only the gate after the install
    # sees it (and the rollback restores the snapshot).
    stale_plugin: bool = False
    # The index serves only the newest release's wheels: older builds (a nightly dev
    # build, the previous torch) are gone, and only uv's cache still has them.
    index_drops_old: bool = False
    # The next real install moves the dependencies (torch...) and then fails writing
    # vllm (disk full), leaving a mixed environment; then clears.
    uv_fails_midway: bool = False
    # Issue 12: GPU hardware and what a stop leaves behind.
    xid_79: bool = False  # GPU stuck_gpu fell off the bus: nvidia-smi exits 15 (kernel: Xid 79)
    pending_remap: bool = False  # GPU stuck_gpu has a row remap pending (kernel: Xid 63)
    ecc_uncorrected: bool = False  # GPU stuck_gpu: an uncorrectable ECC error (kernel: Xid 48)
    unified_memory: bool = False  # every memory figure is [N/A], as on a GB10 (DGX Spark)
    no_gpus: bool = False  # nvidia-smi lists no GPU and exits 0
    orphan_workers: bool = False  # the unit's workers ignore its stop; SIGTERM ends them
    d_state_worker: bool = False  # after a stop Worker_TP<stuck_gpu> hangs in D state: no
    # signal ends it
    # Issue 17: the driver wants GPU stuck_gpu reset: nvidia-smi -q's GPU Reset Status
    # says Reset Required: Yes and Drain and Reset Recommended: Yes (as drivers 535-560
    # print it; the other GPUs say No). No Xid comes with it: -q alone must tell.
    reset_required: bool = False
    # Issue 17: GPU stuck_gpu is in MIG mode and one of its instances logged a contained
    # ECC error: the kernel's Xid 94 in the MIG form, "(PCI:0000:61:00 GPU-I:05)".
    mig_xid: bool = False
    # The driver reports CUDA 12.8 and the index resolves the new release's cu129 build
    # (torch 2.13.0+cu129, the CUDA 12 wheels): CUDA minor-version compatibility runs it.
    cu129_on_cuda_12_8: bool = False
    # The index serves vLLM only as wheels labelled `+cu129` (`.cu129` after a dev build's
    # `+g<commit>`), as wheels.vllm.ai/<version>/cu129 does: uv, the freeze and `uv pip
    # show` say `0.31.0+cu129`, vllm.__version__ and /version say `0.31.0`.
    cu129_wheels: bool = False
    # Issue 17: the venv holds a stale second dist-info of pip (pip-21.3.1 beside
    # pip-22.1.1): `uv pip freeze` lists both, and `uv pip sync` of that cannot resolve.
    duplicate_dist_info: bool = False
    # Issue 17: /metrics answers 200 with no vllm: metric, only prometheus_client's python_*
    # and process_* families, as a server started with --disable-log-stats does.
    metrics_no_vllm: bool = False
    # /metrics under the names of a vLLM before the renames: V0's help texts, no engine
    # label, the KV cache as vllm:gpu_cache_usage_perc (hidden from 0.10, then removed).
    metrics_old_names: bool = False
    # Issue 17: a start logs vLLM's usage-stats thread dying of a PermissionError (it cannot
    # write ~/.config/vllm under ProtectHome=): a thread's traceback, the start goes on.
    usage_thread_exception: bool = False
    # Issue 20: the builds other than the one the host booted with no longer accept the
    # `--task` flag the unit passes (vllm-project/vllm#18538): their `vllm serve --help`
    # does not list it, and a start of one exits at once, as argparse does.
    removed_flag: bool = False
    # The builds other than the one the host booted with no longer list `xxhash` among
    # `--prefix-caching-hash-algo`'s choices (REMOVED_VALUE): argparse refuses a start
    # that passes it ("invalid choice").
    removed_value: bool = False
    # Issue 23, the deep GPU check. GPU stuck_gpu's PCIe link trained at x8 of x16:
    pcie_degraded: bool = False
    # GPU stuck_gpu's clocks are held back by HW slowdown (nvidia-smi -q -x says Active):
    hw_slowdown: bool = False
    # The NVIDIA user-space library was upgraded under the loaded kernel module: every
    # nvidia-smi call prints NVIDIA's "Driver/library version mismatch" and exits 18.
    driver_mismatch: bool = False
    # dcgmi is installed (else `dcgmi` is not found: timeout's exit 127) and its
    # `diag -r 1` passes; with dcgmi_fails, its Persistence Mode test fails.
    dcgmi_present: bool = False
    dcgmi_fails: bool = False
    # GPU stuck_gpu's NVLink link 3 is down: `nvidia-smi nvlink -s` says <inactive>.
    nvlink_down: bool = False
    # Fabric Manager is not running (a driver upgraded without its fabricmanager, as in
    # NVIDIA/NVSentinel#883): every GPU's fabric stays "In Progress" and `nvidia-smi
    # nvlink -s` finds every link down. A reboot does not clear it.
    fabric_stuck: bool = False
    # Issue 23, host maintenance. A reboot never comes back: every SSH login keeps
    # dropping (the host stays down until the fault is cleared).
    reboot_hangs: bool = False
    # A reboot takes reboot_slow_s instead of reboot_delay_s.
    reboot_slow: bool = False
    # `nvidia-smi -r` is always refused "In use by another client", persistence mode off
    # or not (Fabric Manager, or another client, holds the GPU): only a reboot helps.
    reset_refused: bool = False


@dataclass(frozen=True, slots=True)
class Run:
    """The unit's current (or last) run. generation 0 means it never started."""

    generation: int = 0
    main_pid: int = 0
    version: str | None = None
    started_at: float | None = None
    ready_at: float | None = None
    fail_at: float | None = None  # decided at start; cleared by a stop that comes first
    stopped_at: float | None = None  # when the processes exit after a stop


@dataclass(frozen=True, slots=True)
class HostState:
    config: HostConfig
    venv: str
    health_port: int  # where the fake server really listens
    service_port: int  # the port the host claims to serve on (health_url, journal)
    owner_pid: int  # the kit's process: a server whose owner is gone exits
    installed_version: str | None
    faults: Faults = Faults()
    run: Run = Run()
    next_pid: int = FIRST_PID
    busy_since: float | None = None  # when the busy fault was set
    # Every installed package but vllm (which is installed_version): name -> version.
    packages: dict[str, str] = field(default_factory=dict)
    # The wheels in uv's cache, as "name==version".
    cache: tuple[str, ...] = ()
    # The vllm the host booted with (import_error spares it).
    boot_version: str | None = None
    # Simulated PIDs a signal ended (bot.sim.tools.kill).
    dead: tuple[int, ...] = ()
    # Issue 23 (bot.sim.power). /proc/sys/kernel/random/boot_id: new at every reboot.
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    reboots: int = 0  # how many times `systemctl reboot` ran
    rebooted_at: float | None = None  # when the last reboot began
    boot_pending: bool = False  # rebooted, and not yet seen up (its units not started)
    unit_enabled: bool = True  # the unit starts at boot (systemctl enable/disable)
    # Each GPU's persistence mode; None: as every boot leaves it (persistence_at_boot).
    persistence: tuple[bool, ...] | None = None
    # The GPUs `nvidia-smi -r` reset, in order.
    resets: tuple[int, ...] = ()

    @property
    def python(self) -> str:
        return f"{self.venv}/bin/python"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostState:
        cfg = dict(data["config"])
        cfg["available_versions"] = tuple(cfg["available_versions"])
        cfg["index_versions"] = tuple(cfg.get("index_versions", ()))
        return cls(
            config=HostConfig(**cfg),
            faults=Faults(**data["faults"]),
            run=Run(**data["run"]),
            cache=tuple(data.get("cache", ())),
            dead=tuple(data.get("dead", ())),
            resets=tuple(data.get("resets", ())),
            persistence=None if data.get("persistence") is None else tuple(data["persistence"]),
            **{
                f.name: data[f.name]
                for f in fields(cls)
                if f.name not in _CONVERTED and f.name in data
            },
        )


_CONVERTED = ("config", "faults", "run", "cache", "dead", "resets", "persistence")


@dataclass(frozen=True, slots=True)
class JournalEntry:
    ts: float
    ident: str  # "systemd" or "python3"
    pid: int
    msg: str


@dataclass(frozen=True, slots=True)
class Call:
    """One simulated tool invocation; argv[0] is the tool's name."""

    ts: float
    tool: str
    argv: tuple[str, ...]


class Transaction:
    """The state under an exclusive lock; assign ``state`` to change it."""

    def __init__(self, store: StateStore, state: HostState) -> None:
        self._store = store
        self.state = state

    def journal_add(self, entries: Iterable[JournalEntry]) -> None:
        self._store.append_journal_unlocked(entries)

    def journal_drop_after(self, ts: float) -> None:
        """Forget planned lines (a load that a stop interrupted will never log them)."""
        kept = [e for e in self._store.read_journal_unlocked() if e.ts <= ts]
        tmp = self._store.journal_path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(asdict(e)) + "\n" for e in kept), encoding="utf-8")
        os.replace(tmp, self._store.journal_path)


# In a venv `uv venv` made (a prefetch's throwaway venv, a side-by-side release): name ->
# version of what was installed into it (bot.sim.tools.uv writes it).
VENV_SET = "sim-installed.json"


def following_link(st: HostState) -> HostState:
    """A side-by-side venv (its path a symlink to a release, issue 20): what is installed
    is what the release the link points at holds, so switching the link switches what
    the unit starts and what uv reports. A plain venv is the state's own."""
    venv = Path(st.venv)
    if not venv.is_symlink():
        return st
    try:
        raw = json.loads((venv / VENV_SET).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = {}  # a dangling link, or a release nothing was installed into
    env = {str(k): str(v) for k, v in raw.items()}
    return replace(st, installed_version=env.pop("vllm", None), packages=env)


class StateStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.state_path = directory / "state.json"
        self.journal_path = directory / "journal.jsonl"
        self.calls_path = directory / "calls.jsonl"
        self._lock_path = directory / "lock"
        self._cached: tuple[tuple[int, int, int], HostState] | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> StateStore:
        directory = env.get(STATE_DIR_ENV)
        if not directory:
            raise RuntimeError(f"{STATE_DIR_ENV} is not set: not a simulated host")
        return cls(Path(directory))

    def create(self, state: HostState) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for p in (self._lock_path, self.journal_path, self.calls_path):
            p.touch()
        with self._locked(fcntl.LOCK_EX):
            self._write(state)

    @contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        with open(self._lock_path, "a+b") as f:
            fcntl.flock(f, mode)
            yield  # closing the file releases the lock, also if the process dies

    def _write(self, state: HostState) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state.to_json(), indent=1), encoding="utf-8")
        os.replace(tmp, self.state_path)

    def _read_unlocked(self) -> HostState:
        st = HostState.from_json(json.loads(self.state_path.read_text(encoding="utf-8")))
        return following_link(st)

    def read(self) -> HostState:
        with self._locked(fcntl.LOCK_SH):
            return self._read_unlocked()

    def read_cached(self) -> HostState:
        """``read()`` for a long-lived reader (the simulated API server answers every
        request from the state): the file is parsed again only when it was replaced.

        Why: three parses per request made the single-threaded server the bottleneck on a
        starved machine (a router's client at 50 requests/s timed out behind it). The key
        is taken before the read, so a write between the two only costs a second parse;
        the cache never holds content older than its key."""
        try:
            info = os.stat(self.state_path)
        except FileNotFoundError:
            return self.read()  # raises as read() does
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        if self._cached is None or self._cached[0] != key:
            with self._locked(fcntl.LOCK_SH):
                raw = HostState.from_json(json.loads(self.state_path.read_text(encoding="utf-8")))
            self._cached = (key, raw)
        # The venv link is followed each time: a switch changes no byte of the state.
        return following_link(self._cached[1])

    def journal_append(self, entries: Iterable[JournalEntry]) -> None:
        """Lines added under the lock, the state left unread (a transaction parses it)."""
        with self._locked(fcntl.LOCK_EX):
            self.append_journal_unlocked(entries)

    def append_journal_unlocked(self, entries: Iterable[JournalEntry]) -> None:
        lines = "".join(json.dumps(asdict(e)) + "\n" for e in entries)
        with open(self.journal_path, "a", encoding="utf-8") as f:
            f.write(lines)

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        with self._locked(fcntl.LOCK_EX):
            before = self._read_unlocked()
            tx = Transaction(self, before)
            yield tx
            if tx.state != before:
                self._write(tx.state)

    def read_journal_unlocked(self) -> list[JournalEntry]:
        with open(self.journal_path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        # One decode of the lines as an array: a verbose start logs tens of thousands of
        # lines, and each journalctl call reads them all (half the CPU of a line at a time).
        return [JournalEntry(**d) for d in json.loads("[" + ",".join(lines) + "]")]

    def journal(self) -> list[JournalEntry]:
        """Every entry, planned future ones included; callers keep those up to now."""
        with self._locked(fcntl.LOCK_SH):
            return self.read_journal_unlocked()

    def log_call(self, tool: str, argv: Iterable[str]) -> None:
        line = json.dumps({"ts": time.time(), "tool": tool, "argv": list(argv)}) + "\n"
        # One O_APPEND write per call: concurrent tools never interleave within a line.
        fd = os.open(self.calls_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def calls(self) -> list[Call]:
        out = []
        with open(self.calls_path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    out.append(Call(d["ts"], d["tool"], tuple(d["argv"])))
        return out


# --- what the host looks like at time `now` -------------------------------------------


@dataclass(frozen=True, slots=True)
class SimGpu:
    index: int
    uuid: str
    name: str
    used_mib: int
    total_mib: int
    util_pct: int
    memory_reported: bool = True  # False: nvidia-smi prints [N/A] (unified memory)
    lost: bool = False  # fell off the bus: nvidia-smi cannot reach it
    remap_pending: bool = False  # nvidia-smi -q: Remapped Rows / Pending: Yes
    ecc_uncorrected: int = 0  # nvidia-smi -q: DRAM Uncorrectable (volatile and aggregate)
    reset_required: bool = False  # nvidia-smi -q: GPU Reset Status says Yes (issue 17)
    pcie_width: int = 16  # nvidia-smi -q -x: current_link_width (max is 16), issue 23
    hw_slowdown: bool = False  # nvidia-smi -q -x: clocks_event_reason_hw_slowdown Active
    fabric_registered: bool = True  # nvidia-smi -q -x: fabric Completed, not In Progress
    persistence: bool = True  # persistence mode (issue 23: nvidia-smi -pm)


@dataclass(frozen=True, slots=True)
class SimProcess:
    pid: int
    cmdline: str
    gpu: int | None  # the GPU it holds memory on, if any
    used_mib: int
    # What ps shows (issue 12): its state, account, start and unit (cgroup).
    state: str = "Sl"
    user: str = "vllm"
    started: float = 0.0
    unit: str = ""


def unit_state(run: Run, now: float) -> tuple[str, str]:
    """systemd's (ActiveState, SubState) for a Type=simple unit."""
    if run.started_at is None:
        return "inactive", "dead"
    if run.fail_at is not None and now >= run.fail_at:
        return "failed", "failed"
    if run.stopped_at is not None:
        return ("deactivating", "stop-sigterm") if now < run.stopped_at else ("inactive", "dead")
    return "active", "running"


def main_pid(run: Run, now: float) -> int:
    return run.main_pid if unit_state(run, now)[0] in ("active", "deactivating") else 0


def ended_at(run: Run, now: float) -> float | None:
    """When the run's processes exited (stop or crash), if they have by now."""
    ends = [t for t in (run.stopped_at, run.fail_at) if t is not None and t <= now]
    return min(ends) if ends else None


def is_serving(run: Run, now: float) -> bool:
    """The model is loaded and the port should answer."""
    return unit_state(run, now)[0] == "active" and run.ready_at is not None and now >= run.ready_at


def gpu_uuid(hostname: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{index}.gpu.{hostname}')}"


def _loaded_mib(st: HostState, run: Run, at: float) -> int:
    """Memory per GPU at time `at`: grows while the weights load."""
    assert run.started_at is not None
    load = st.config.load_delay_s
    frac = 1.0 if load <= 0 else min(max((at - run.started_at) / load, 0.0), 1.0)
    return round(st.config.service_used_mib * frac)


def unit_gpus(cfg: HostConfig) -> list[int]:
    """The GPUs the unit runs on: all but the neighbour's."""
    return [i for i in range(cfg.gpus) if i not in cfg.neighbour_gpus]


NEIGHBOUR_PID = 30001
NEIGHBOUR_STARTED = 1_764_000_000.0  # when the neighbour service started (a fixed past day)


def _lingers(st: HostState, pid: int, gpu: int) -> str | None:
    """The state of a worker that outlived its unit's stop (None: it exited)."""
    f = st.faults
    if pid in st.dead:
        return None
    if gpu == st.config.stuck_gpu and f.d_state_worker:
        return "D"
    if gpu == st.config.stuck_gpu and f.stuck_worker:
        return "Sl"
    return "Sl" if f.orphan_workers else None


def _unit_procs(st: HostState, now: float) -> tuple[list[SimProcess], dict[int, int]]:
    """The unit's processes now, and the memory each GPU's worker holds."""
    cfg, run = st.config, st.run
    end = ended_at(run, now)
    alive = run.started_at is not None and (end is None or now < end + cfg.release_delay_s)
    started, unit = run.started_at or 0.0, cfg.unit
    level = _loaded_mib(st, run, now if end is None else end) if alive else 0
    procs: list[SimProcess] = []
    held: dict[int, int] = {}
    mine = unit_gpus(cfg)
    if alive and end is None:
        procs.append(
            SimProcess(
                run.main_pid,
                f"{st.venv}/bin/python3 {st.venv}/bin/vllm serve {cfg.model} "
                f"--tensor-parallel-size {len(mine)} --port {st.service_port}",
                None,
                0,
                started=started,
                unit=unit,
                user=cfg.unit_user,
            )
        )
    engine = run.main_pid + ENGINE_PID_OFFSET
    if (alive and end is None) or (
        end is not None and st.faults.orphan_workers and engine not in st.dead
    ):
        procs.append(
            SimProcess(
                engine, "VLLM::EngineCore", None, 0, started=started, unit=unit, user=cfg.unit_user
            )
        )
    for tp, i in enumerate(mine):
        pid = run.main_pid + WORKER_PID_OFFSET + tp
        state = "Sl" if alive else (_lingers(st, pid, i) if end is not None else None)
        if state is None:
            continue
        used = (
            level
            if alive
            else (
                cfg.stuck_worker_mib
                if (i == cfg.stuck_gpu and (st.faults.stuck_worker or st.faults.d_state_worker))
                else _loaded_mib(st, run, end or now)
            )
        )
        held[i] = used
        procs.append(
            SimProcess(
                pid,
                f"VLLM::Worker_TP{tp}",
                i,
                max(used - CONTEXT_MIB, 0),
                state=state,
                started=started,
                unit=unit,
                user=cfg.unit_user,
            )
        )
    return procs, held


def booted_at(st: HostState) -> float | None:
    """When the host is up again after its last reboot (None: it never rebooted)."""
    if st.rebooted_at is None:
        return None
    delay = st.config.reboot_slow_s if st.faults.reboot_slow else st.config.reboot_delay_s
    return st.rebooted_at + delay


def is_down(st: HostState, now: float) -> bool:
    """Rebooting: no SSH login gets through, nothing runs."""
    if not st.boot_pending:
        return False
    up = booted_at(st)
    return st.faults.reboot_hangs or (up is not None and now < up)


def persistence_of(st: HostState, index: int) -> bool:
    if st.persistence is None or index >= len(st.persistence):
        return st.config.persistence_at_boot
    return st.persistence[index]


def _neighbour_procs(st: HostState, now: float) -> list[SimProcess]:
    cfg = st.config
    if not cfg.neighbour_unit or is_down(st, now):
        return []
    up, unit = booted_at(st) or NEIGHBOUR_STARTED, cfg.neighbour_unit
    procs = [
        SimProcess(
            NEIGHBOUR_PID,
            f"{st.venv}/bin/python3 {st.venv}/bin/vllm serve "
            f"/models/neighbour --tensor-parallel-size {len(cfg.neighbour_gpus)}",
            None,
            0,
            started=up,
            unit=unit,
            user=cfg.unit_user,
        ),
        SimProcess(
            NEIGHBOUR_PID + ENGINE_PID_OFFSET,
            "VLLM::EngineCore",
            None,
            0,
            started=up,
            unit=unit,
            user=cfg.unit_user,
        ),
    ]
    for tp, i in enumerate(cfg.neighbour_gpus):
        pid = NEIGHBOUR_PID + WORKER_PID_OFFSET + tp
        if pid not in st.dead:
            procs.append(
                SimProcess(
                    pid,
                    f"VLLM::Worker_TP{tp}",
                    i,
                    cfg.neighbour_used_mib - CONTEXT_MIB,
                    started=up,
                    unit=unit,
                    user=cfg.unit_user,
                )
            )
    return [p for p in procs if p.pid not in st.dead]


def host_view(st: HostState, now: float) -> tuple[list[SimGpu], list[SimProcess]]:
    cfg, run = st.config, st.run
    procs, held = _unit_procs(st, now)
    neighbours = _neighbour_procs(st, now)
    procs += neighbours
    serving = ended_at(run, now) is None and is_serving(run, now)
    gpus = []
    for i in range(cfg.gpus):
        used = held.get(i, 0)
        if i in cfg.neighbour_gpus:
            used = max((p.used_mib + CONTEXT_MIB for p in neighbours if p.gpu == i), default=0)
        # A serving model keeps the GPUs busy in bursts; the number only has to move.
        busy = serving or i in cfg.neighbour_gpus
        util = (int(now * 2) * 7919 + i * 104729) % 36 if busy else 0
        sick = i == cfg.stuck_gpu
        gpus.append(
            SimGpu(
                i,
                gpu_uuid(cfg.hostname, i),
                cfg.gpu_name,
                used,
                cfg.gpu_total_mib,
                util,
                memory_reported=not st.faults.unified_memory,
                lost=st.faults.xid_79 and sick,
                remap_pending=st.faults.pending_remap and sick,
                ecc_uncorrected=1 if st.faults.ecc_uncorrected and sick else 0,
                reset_required=st.faults.reset_required and sick,
                pcie_width=8 if st.faults.pcie_degraded and sick else 16,
                hw_slowdown=st.faults.hw_slowdown and sick,
                fabric_registered=not st.faults.fabric_stuck,
                persistence=persistence_of(st, i),
            )
        )
    if st.faults.no_gpus:
        gpus = []
    return gpus, procs


def in_flight(st: HostState, now: float) -> tuple[int, int]:
    """(running, waiting) requests at ``now``: with the busy fault, they finish evenly
    over busy_drain_s, the waiting ones first."""
    cfg = st.config
    if not st.faults.busy or st.busy_since is None:
        return 0, 0
    left = 1.0 - (now - st.busy_since) / cfg.busy_drain_s if cfg.busy_drain_s > 0 else 0.0
    total = math.ceil(max(left, 0.0) * (cfg.busy_running + cfg.busy_waiting))
    return min(total, cfg.busy_running), max(total - cfg.busy_running, 0)


def format_journal(entry: JournalEntry, hostname: str) -> str:
    """journalctl's default ``short`` output."""
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime(entry.ts))
    return f"{stamp} {hostname} {entry.ident}[{entry.pid}]: {entry.msg}"


def vllm_line(ts: float, level: str, source: str, text: str) -> str:
    """A message the way vLLM's logger prints it."""
    return f"{level} {time.strftime('%m-%d %H:%M:%S', time.localtime(ts))} [{source}] {text}"


def replace_run(st: HostState, **changes: Any) -> HostState:
    return replace(st, run=replace(st.run, **changes))


def exec_start(st: HostState) -> tuple[str, ...]:
    """The unit's command line (ExecStart): `vllm serve` from the venv, or the wrapper."""
    cfg = st.config
    if cfg.exec_wrapper:
        return cfg.exec_wrapper
    return (
        f"{st.venv}/bin/vllm",
        "serve",
        cfg.model,
        "--tensor-parallel-size",
        str(len(unit_gpus(cfg))),
        "--port",
        str(st.service_port),
        *cfg.unit_flags,
    )


def unit_args(st: HostState) -> tuple[str, ...]:
    """The unit's flags as a start passes them: ``$NAME`` split into words, ``${NAME}``
    replaced, from Environment= and the EnvironmentFiles (later ones winning). The
    simulator's own plain reading: ``NAME=value`` lines, quotes around a value removed."""
    env: dict[str, str] = {}
    for assignment in st.config.unit_environment:
        name, _, value = assignment.partition("=")
        env[name] = value
    for path in st.config.unit_env_files:
        env.update(_env_file(Path(path.removeprefix("-"))))
    words: list[str] = []
    for word in st.config.unit_flags:
        if word.startswith("$") and not word.startswith("${"):
            words += env.get(word[1:], "").split()
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m[1], ""), word))
    return tuple(words)


def _env_file(path: Path) -> dict[str, str]:
    try:
        text = path.read_text()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and not name.startswith("#"):
            value = value.strip()
            quoted = len(value) > 1 and value[0] == value[-1] and value[0] in "'\""
            env[name.strip()] = value[1:-1] if quoted else value
    return env


def refused_flags(st: HostState, version: str | None) -> tuple[str, ...]:
    """The unit's flags that ``version`` of vllm does not accept (the removed_flag fault)."""
    if not st.faults.removed_flag or version == st.boot_version:
        return ()
    return tuple(f for f in unit_args(st) if f == "--task")


# The removed_value fault: the option, and the value of it that the builds other than the
# booted one no longer list.
REMOVED_VALUE = ("--prefix-caching-hash-algo", "xxhash")
REMOVED_VALUE_LEFT = ("sha256", "sha256_cbor", "xxhash_cbor")


def value_removed(st: HostState, version: str | None) -> bool:
    return st.faults.removed_value and version != st.boot_version


def refused_value(st: HostState, version: str | None) -> bool:
    """Whether the unit passes the value ``version`` no longer lists (removed_value)."""
    if not value_removed(st, version):
        return False
    args, (flag, value) = unit_args(st), REMOVED_VALUE
    pairs = itertools.pairwise(args)
    return f"{flag}={value}" in args or (flag, value) in pairs
