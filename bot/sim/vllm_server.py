"""The fake vLLM API server one run of the simulated unit starts.

``systemctl start`` spawns it detached (its own session, like a process systemd
owns).  It binds nothing until the model is "loaded", so a health check while
loading gets a real connection refused; then it answers ``/health`` (200, or
503 with the health_503 fault), ``/version``, ``/v1/models``, ``/metrics`` and
``POST /v1/completions`` in vLLM's formats (faults ``wrong_model``, ``smoke_fail``,
``smoke_empty``, ``busy``, ``metrics_no_vllm``, ``metrics_old_names``).  It exits by
itself as soon as its run is stopped, crashes or is replaced, or the kit that
owns the host is gone, so a crashed test leaves nothing listening.

Run as ``python -S -m bot.sim.vllm_server <state_dir> <generation>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from bot.sim import procfs
from bot.sim.packages import module_version
from bot.sim.state import (
    STATE_DIR_ENV,
    HostState,
    JournalEntry,
    StateStore,
    in_flight,
    replace_run,
    unit_state,
    vllm_line,
)

MODULE = "bot.sim.vllm_server"
POLL_S = 0.1  # how soon a stopped or superseded server notices
MAX_FD = 1 << 16
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def spawn(state_dir: Path, generation: int) -> None:
    """Start the server for one run, detached like a process systemd owns.

    ``setsid --fork`` leaves it a child of init rather than of the caller, so a
    long-lived caller has nothing to reap. A tool run by the fork server (``systemctl
    start``, and a kit's first boot: ``bot.sim.tools.BOOT``) has this module imported
    already: it forks the server instead (a fresh interpreter importing ``http.server``
    cost 0.1 s of CPU per start), and records it in ``servers/`` as its command line
    cannot say whose it is.
    """
    if procfs.standing_for() is not None:
        _fork(state_dir, generation)
        return
    # The state directory in its environment marks it as this host's for the kit's cleanup.
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), **{STATE_DIR_ENV: str(state_dir)})
    subprocess.run(
        ["setsid", "--fork", sys.executable, "-S", "-m", MODULE, str(state_dir), str(generation)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        close_fds=True,
    )


def _fork(state_dir: Path, generation: int) -> None:
    """Double-fork a detached server from this (forked, simulator-loaded) process."""
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    code = 1
    try:
        os.setsid()
        if os.fork():
            os._exit(0)  # the server is now init's, like a process systemd owns
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        # Nothing of the tool's: its pipes (the caller waits for their end) and any lock.
        os.closerange(3, MAX_FD)
        me = os.getpid()
        record = _records(state_dir) / str(me)
        record.parent.mkdir(exist_ok=True)
        record.write_text(str(procfs.start_time(me)))
        try:
            code = serve(StateStore(state_dir), generation)
        finally:
            record.unlink(missing_ok=True)
    finally:
        os._exit(code)  # never the tool's exit path: its buffers are the tool's output


def _records(state_dir: Path) -> Path:
    return state_dir / "servers"


def _recorded(state_dir: Path) -> list[int]:
    """Forked servers still running (a record whose pid now names another process, one
    started at another time, is stale)."""
    out = []
    try:
        records = list(_records(state_dir).iterdir())
    except OSError:
        return []
    for record in records:
        try:
            pid, started = int(record.name), int(record.read_text())
        except (OSError, ValueError):
            continue
        if procfs.start_time(pid) == started:
            out.append(pid)
        else:
            record.unlink(missing_ok=True)
    return out


def _ours(state_dir: Path) -> list[int]:
    target = str(state_dir)
    spawned = procfs.matching(lambda argv: MODULE in argv and target in argv)
    return sorted({*spawned, *_recorded(state_dir)})


def stop_all(state_dir: Path) -> None:
    """End every server of this host, including one whose pid was never recorded."""
    procfs.terminate(_ours(state_dir))


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _current(store: StateStore, generation: int) -> HostState | None:
    """The state while this server's run is still the live one, else None."""
    if not store.state_path.exists():
        return None
    st = store.read_cached()
    now = time.time()
    if (
        st.run.generation != generation
        or unit_state(st.run, now)[0] != "active"
        or not _owner_alive(st.owner_pid)
    ):
        return None
    return st


class _Server(HTTPServer):
    # uvicorn's listen backlog (its --backlog default), not http.server's 5: behind a
    # router under load (issue 19's client at 50 requests/s, the router's checks) a
    # backlog of 5 overflowed on a busy machine and refused connections a real vLLM
    # would have queued, so the router marked a healthy replica DOWN.
    request_queue_size = 2048


class _Handler(BaseHTTPRequestHandler):
    timeout = 5.0  # a client that connects and says nothing must not wedge the server
    store: StateStore  # set on the subclass made in serve()

    def version_string(self) -> str:
        return "uvicorn"

    def log_message(self, format: str, *args: object) -> None:
        pass  # access lines go to the journal instead

    def do_GET(self) -> None:
        st = self.store.read_cached()
        path = self.path.split("?", 1)[0]
        body = b""
        kind = "application/json"
        if path == "/health":
            status = 503 if st.faults.health_503 else 200
        elif path == "/version":
            # vLLM reports its own __version__: no `+cu129` label of the wheel.
            version = None if st.run.version is None else module_version(st.run.version)
            status, body = 200, json.dumps({"version": version}).encode()
        elif path == "/v1/models":
            status, body = 200, json.dumps(_models(st)).encode()
        elif path == "/metrics":
            status, body = 200, metrics_text(st, time.time()).encode()
            kind = "text/plain; version=0.0.4; charset=utf-8"
        else:
            status, body = 404, b'{"detail":"Not Found"}'
        self._answer("GET", path, status, body, kind, st)

    def do_POST(self) -> None:
        st = self.store.read_cached()
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("content-length") or 0)
        request = _json_object(self.rfile.read(min(length, 1 << 20)))
        if path == "/v1/completions" and _hung(st):
            # A hung engine: the request is taken and never answered. Held engine_hang_s
            # (bounded: this server is single-threaded), then the connection is dropped.
            time.sleep(st.config.engine_hang_s)
            self.close_connection = True
            return
        if path == "/v1/completions":
            status, answer = _completion(st, request)
        else:
            status, answer = 404, {"detail": "Not Found"}
        self._answer("POST", path, status, json.dumps(answer).encode(), "application/json", st)

    def _answer(
        self, method: str, path: str, status: int, body: bytes, kind: str, st: HostState
    ) -> None:
        self.send_response(status)
        if body:
            self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.store.log_call("http", [method, path])
        host, port = self.client_address[:2]
        reason = self.responses[status][0]
        # vLLM puts its API server's prefix before uvicorn's access lines too.
        line = (
            f"(APIServer pid={st.run.main_pid}) "
            f'INFO:     {host}:{port} - "{method} {path} HTTP/1.1" {status} {reason}'
        )
        self.store.journal_append([JournalEntry(time.time(), "python3", st.run.main_pid, line)])


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _api_fault(st: HostState, on: bool) -> bool:
    """An API fault as this run has it: with api_faults_new_build_only, the build the host
    booted with is spared."""
    spared = st.config.api_faults_new_build_only and st.run.version == st.boot_version
    return on and not spared


def _models(st: HostState) -> dict[str, Any]:
    """vLLM's ModelList (vllm/entrypoints/openai/protocol.py)."""
    cfg = st.config
    served = "Kimi-K2-Instruct" if _api_fault(st, st.faults.wrong_model) else cfg.served_model
    started = int(st.run.started_at or 0)
    return {
        "object": "list",
        "data": [
            {
                "id": served,
                "object": "model",
                "created": started,
                "owned_by": "vllm",
                "root": cfg.model,
                "parent": None,
                "max_model_len": 262144,
                "permission": [
                    {
                        "id": f"modelperm-{st.run.generation:08x}",
                        "object": "model_permission",
                        "created": started,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }


def _error(message: str, kind: str, code: int) -> tuple[int, dict[str, Any]]:
    """vLLM's ErrorResponse."""
    return code, {"object": "error", "message": message, "type": kind, "param": None, "code": code}


def _hung(st: HostState) -> bool:
    """engine_hangs_after_ready: a new build's engine hangs hang_after_ready_s after it is
    ready; /health goes on answering 200 (vllm-project/vllm#36960)."""
    ready = st.run.ready_at
    return (
        _api_fault(st, st.faults.engine_hangs_after_ready)
        and ready is not None
        and time.time() >= ready + st.config.hang_after_ready_s
    )


def _completion(st: HostState, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """vLLM's CompletionResponse: the configured text, cut to max_tokens words."""
    cfg = st.config
    served = _models(st)["data"][0]["id"]
    if request.get("model") != served:
        return _error(f"The model `{request.get('model')}` does not exist.", "NotFoundError", 404)
    if _api_fault(st, st.faults.smoke_fail):
        return _error(
            "EngineCore encountered an issue. See stack trace (above) for the root cause.",
            "InternalServerError",
            500,
        )
    words = cfg.completion_text.split(" ")
    max_tokens = int(request.get("max_tokens") or 16)
    text = " ".join(words[: max_tokens + 1])
    prompt = str(request.get("prompt", ""))
    n_prompt, n_out = len(prompt.split()), min(len(words), max_tokens)
    finish = "length"
    if _api_fault(st, st.faults.smoke_empty):  # the end-of-sequence token first: an empty text
        text, n_out, finish = "", 1, "stop"
    now = int(time.time())
    return 200, {
        "id": f"cmpl-{now:x}",
        "object": "text_completion",
        "created": now,
        "model": served,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": n_prompt,
            "total_tokens": n_prompt + n_out,
            "completion_tokens": n_out,
        },
    }


# (name, HELP) of the gauges a current vLLM (0.3x) publishes for the load, engine by engine
# (vllm/v1/metrics/loggers.py, PrometheusStatLogger), and those of a vLLM before the renames
# (V0's texts; the KV cache as vllm:gpu_cache_usage_perc, hidden from 0.10, then removed).
_RUNNING_HELP = "Number of requests in model execution batches."
_WAITING_HELP = "Number of requests waiting to be processed."
_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
    "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
    "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting."
)
_KV_HELP = "KV-cache usage. 1 means 100 percent usage."
_OLD_GAUGES = (
    ("vllm:num_requests_running", "Number of requests currently running on GPU."),
    ("vllm:num_requests_waiting", _WAITING_HELP),
    ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."),
)


def metrics_text(st: HostState, now: float) -> str:
    """What vLLM's /metrics answers, in the Prometheus text format prometheus_client
    writes (vLLM publishes with it): the scheduler gauges and the KV-cache usage of
    engine 0, labelled as vLLM labels them (vllm/v1/metrics/loggers.py), or with
    metrics_old_names as a vLLM before the renames wrote them. Written by hand because
    this server runs without site-packages (``python -S``)."""
    if st.faults.metrics_no_vllm:
        return _process_metrics(st, now)
    running, waiting = in_flight(st, now)
    kv = min(0.05 * (running + waiting), 1.0)
    model = st.config.served_model
    if st.faults.metrics_old_names:
        samples = [
            (name, doc, f'{{model_name="{model}"}}', v)
            for (name, doc), v in zip(_OLD_GAUGES, (running, waiting, kv), strict=True)
        ]
        return _exposition(samples)
    labels = f'engine="0",model_name="{model}"'
    return _exposition(
        [
            ("vllm:num_requests_running", _RUNNING_HELP, f"{{{labels}}}", running),
            ("vllm:num_requests_waiting", _WAITING_HELP, f"{{{labels}}}", waiting),
            *(
                (
                    "vllm:num_requests_waiting_by_reason",
                    _BY_REASON_HELP,
                    f'{{{labels},reason="{reason}"}}',
                    n,
                )
                for reason, n in (("capacity", waiting), ("deferred", 0))
            ),
            ("vllm:kv_cache_usage_perc", _KV_HELP, f"{{{labels}}}", kv),
        ]
    )


def _exposition(samples: list[tuple[str, str, str, float]]) -> str:
    """Gauge samples (name, HELP, labels, value) as prometheus_client writes them: one
    HELP and TYPE per family, before its first sample."""
    out: list[str] = []
    seen: set[str] = set()
    for name, doc, labels, value in samples:
        if name not in seen:
            seen.add(name)
            out += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
        out.append(f"{name}{labels} {float(value)!r}")
    return "\n".join(out) + "\n"


def _process_metrics(st: HostState, now: float) -> str:
    """/metrics of a server that registers no vLLM metric (``--disable-log-stats``: no
    stat logger, vllm/v1/engine/async_llm.py): prometheus_client's default collectors
    only, in their format (the families vllm-project/vllm issue #26762 and PR #3938
    show: python_gc_*, python_info, process_*)."""
    started = st.run.started_at or now
    families: list[tuple[str, str, str, list[tuple[str, float]]]] = [
        (
            "python_gc_objects_collected_total",
            "Objects collected during gc",
            "counter",
            [(f'{{generation="{g}"}}', float(n)) for g, n in enumerate((8841, 1102, 67))],
        ),
        (
            "python_gc_collections_total",
            "Number of times this generation was collected",
            "counter",
            [(f'{{generation="{g}"}}', float(n)) for g, n in enumerate((903, 81, 6))],
        ),
        (
            "python_info",
            "Python platform information",
            "gauge",
            [
                (
                    '{implementation="CPython",major="3",minor="12",patchlevel="3",version="3.12.3"}',
                    1.0,
                )
            ],
        ),
        ("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge", [("", 3.1e9)]),
        (
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            "gauge",
            [("", float(round(started, 2)))],
        ),
        ("process_open_fds", "Number of open file descriptors.", "gauge", [("", 97.0)]),
    ]
    out = []
    for name, doc, kind, samples in families:
        out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        out += [f"{name}{labels} {value!r}" for labels, value in samples]
    return "\n".join(out) + "\n"


def _bind_failed(store: StateStore, generation: int, err: OSError) -> int:
    now = time.time()
    with store.transaction() as tx:
        st = tx.state
        if st.run.generation == generation:
            tx.journal_add(
                [
                    JournalEntry(
                        now,
                        "python3",
                        st.run.main_pid,
                        f"(APIServer pid={st.run.main_pid}) "
                        + vllm_line(
                            now,
                            "ERROR",
                            "api_server.py:1960",
                            f"[Errno {err.errno}] {err.strerror}",
                        ),
                    )
                ]
            )
            tx.state = replace_run(st, fail_at=now)
    return 1


def serve(store: StateStore, generation: int) -> int:
    while True:
        st = _current(store, generation)
        if st is None:
            return 0
        assert st.run.ready_at is not None
        wait = st.run.ready_at - time.time()
        if wait <= 0:
            break
        time.sleep(min(wait, POLL_S))
    handler = type("Handler", (_Handler,), {"store": store})
    try:
        httpd = _Server(("127.0.0.1", st.health_port), handler)
    except OSError as e:
        return _bind_failed(store, generation, e)
    httpd.timeout = POLL_S
    with httpd:
        # Whether this run is still live is asked at most every POLL_S, not before each
        # request: under a client's steady load that check was a third of each request.
        checked = time.monotonic()
        while True:
            httpd.handle_request()
            if time.monotonic() - checked >= POLL_S:
                if _current(store, generation) is None:
                    return 0
                checked = time.monotonic()


def main(argv: list[str]) -> int:
    return serve(StateStore(Path(argv[0])), int(argv[1]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
