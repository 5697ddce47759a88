"""Simulated ``uv``: ``pip show``, ``pip freeze``, ``pip install`` (and its dry run),
``pip sync`` and ``venv``, over the host's whole environment (``bot.sim.packages``).

Like uv 0.13, everything but ``pip show`` and ``pip freeze`` reports on stderr. A vllm
version pulls in its release's packages (torch, the CUDA wheels...); an install changes
every one that moves and never removes one (as uv pip install does), ``pip sync`` makes
the environment exactly its file. Wheels come from uv's cache when it holds them; any
other is downloaded (``download_mib_per_s``, ``download_delay_s``) and then cached, and
``--offline`` finds only what is cached. A real install streams its progress over
``install_duration_s`` plus its downloads; vllm is gone from the "Uninstalled" line until
the "Installed" one, so an install killed in between leaves vllm missing, as it would on
a real host. An install into another venv made by ``uv venv`` (the bot's prefetch)
changes nothing but the cache. Given the host's venv (``--python``), uv starts its
interpreter first, as real uv does to learn about it, which runs its ``.pth`` files.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bot.sim import packages as pk
from bot.sim import pth
from bot.sim.state import VENV_SET, HostState, StateStore

UV_VERSION = "uv 0.13.9"
PACKAGE = pk.PACKAGE
REQUIRES = (
    "aiohttp, blake3, cachetools, cloudpickle, compressed-tensors, depyf, einops, fastapi, "
    "filelock, gguf, lark, llguidance, lm-format-enforcer, mistral-common, msgspec, ninja, "
    "numba, numpy, openai, opencv-python-headless, outlines-core, partial-json-parser, pillow, "
    "prometheus-client, protobuf, psutil, py-cpuinfo, pybase64, pydantic, pyyaml, pyzmq, ray, "
    "regex, requests, scipy, sentencepiece, setproctitle, setuptools, six, tiktoken, "
    "tokenizers, torch, torchaudio, torchvision, tqdm, transformers, typing-extensions, "
    "watchfiles, xgrammar"
)
NO_VENV = (
    "error: No virtual environment found; run `uv venv` to create an environment, "
    "or pass `--system` to install into a non-virtual environment"
)
OUTPUT_BATCHES = 50
FLOOD_BLOCK = 1024 * 1024
STALL_POLL_S = 0.05
# Written into a venv `uv venv` makes, so an install into it is known for a throwaway.
VENV_MARK = "# simulated by bot.sim.tools.uv\n"
# In a throwaway venv (or a side-by-side release): name -> version of what was installed.
THROWAWAY_SET = VENV_SET


def throwaway_set(venv: Path) -> dict[str, str]:
    """What was installed into the venv ``uv venv`` made at ``venv``: nothing yet when no
    install has recorded its set there."""
    try:
        raw = json.loads((venv / THROWAWAY_SET).read_text())
    except FileNotFoundError:
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def _elapsed(seconds: float) -> str:
    """uv's own duration format: 812ms, 1.31s, 2m 05s."""
    if seconds >= 60:
        return f"{int(seconds) // 60}m {int(seconds) % 60:02d}s"
    if seconds >= 1:
        return f"{int(seconds)}.{int(seconds * 100) % 100:02d}s"
    return f"{int(seconds * 1000)}ms"


def _plural(n: int, noun: str = "package") -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _err(text: str) -> None:
    _write(text + "\n")


def _write(text: str) -> None:
    # Once the SSH connection is gone (OpenSSH leaves a command without a pty running),
    # stderr is a closed pipe.  The simulator then takes the case that is harder for the
    # bot: the install goes on to the end regardless, still changing the venv.
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except OSError:
        pass


def _python_error(python: str | None) -> str | None:
    if python is None:
        return NO_VENV
    if not os.path.exists(python):
        return (
            f"error: Failed to inspect Python interpreter from provided path at `{python}`\n"
            "  Caused by: Failed to query Python interpreter\n"
            "  Caused by: No such file or directory (os error 2)"
        )
    return None


def _ours(st: HostState, python: str) -> bool:
    return os.path.realpath(python) == os.path.realpath(st.python)


def _throwaway(python: str) -> bool:
    """A venv `uv venv` made (the bot's prefetch): only the cache changes."""
    cfg = Path(python).parent.parent / "pyvenv.cfg"
    try:
        return cfg.read_text().endswith(VENV_MARK)
    except OSError:
        return False


def _unexpected(arg: str, sub: str) -> int:
    _err(
        f"error: unexpected argument '{arg}' found\n\n"
        f"Usage: uv pip {sub} [OPTIONS] <PACKAGE>\n\nFor more information, try '--help'."
    )
    return 2


def _externally_managed(python: str) -> int:
    _err(
        f"error: The interpreter at {os.path.dirname(os.path.dirname(python))} is "
        "externally managed, and indicates the following:\n\n"
        "  To install Python packages system-wide, try apt install python3-xyz"
    )
    return 2


def _show(store: StateStore, args: list[str]) -> int:
    python: str | None = None
    names: list[str] = []
    it = iter(args)
    for a in it:
        if a in ("--python", "-p"):
            python = next(it, "")
        elif a.startswith("--python="):
            python = a.split("=", 1)[1]
        elif a.startswith("-"):
            return _unexpected(a, "show")
        else:
            names.append(a)
    st = store.read()
    problem = _python_error(python)
    if problem:
        _err(problem)
        return 2
    assert python is not None
    blocks, missing = [], []
    for name in names:
        version = st.installed_version if _ours(st, python) else None
        if name.lower() != PACKAGE or version is None:
            missing.append(name)
            continue
        blocks.append(
            f"Name: {PACKAGE}\nVersion: {version}\n"
            f"Location: {st.venv}/lib/python3.12/site-packages\n"
            f"Requires: {REQUIRES}\nRequired-by:\n"
        )
    sys.stdout.write("---\n".join(blocks))
    if missing:
        _err(f"warning: Package(s) not found for: {', '.join(missing)}")
        return 1
    return 0


@dataclass
class _Request:
    python: str | None = None
    dry_run: bool = False
    reinstall_all: bool = False
    offline: bool = False
    no_deps: bool = False
    reinstall: set[str] = field(default_factory=set)
    indexes: list[str] = field(default_factory=list)
    specs: list[str] = field(default_factory=list)
    requirements: list[str] = field(default_factory=list)  # -r files

    @property
    def reinstalls(self) -> bool:
        return self.reinstall_all or PACKAGE in self.reinstall


_VALUE_OPTIONS = (
    "--python",
    "-p",
    "--reinstall-package",
    "--extra-index-url",
    "--index-url",
    "-i",
    "-r",
    "--requirement",
)
_FLAGS = {
    "--dry-run": "dry_run",
    "--force-reinstall": "reinstall_all",
    "--reinstall": "reinstall_all",
    "--offline": "offline",
    "--no-deps": "no_deps",
}


def _parse_install(args: list[str], env: Mapping[str, str] = os.environ) -> _Request | str:
    req = _Request()
    extra_flag = index_flag = False
    it = iter(args)
    for a in it:
        key, eq, val = a.partition("=")
        if key in _VALUE_OPTIONS and not (eq and key.startswith("--")):
            val = next(it, "")
        if key in ("--python", "-p"):
            req.python = val
        elif key == "--reinstall-package":
            req.reinstall.add(val.lower())
        elif key in ("-r", "--requirement"):
            req.requirements.append(val)
        elif key in ("--extra-index-url", "--index-url", "-i"):
            req.indexes.append(val)
            extra_flag |= key == "--extra-index-url"
            index_flag |= key != "--extra-index-url"
        elif a in _FLAGS:
            setattr(req, _FLAGS[a], True)
        elif a in ("--quiet", "-q"):
            pass
        elif a.startswith("-"):
            return a
        else:
            req.specs.append(a)
    return _from_env(req, env, extra_flag=extra_flag, index_flag=index_flag)


def _from_env(
    req: _Request, env: Mapping[str, str], *, extra_flag: bool, index_flag: bool
) -> _Request:
    # As uv's clap options do: the variable stands in for its flag when the flag is absent
    # (UV_EXTRA_INDEX_URL holds space-separated URLs).
    if not extra_flag:
        req.indexes.extend(env.get("UV_EXTRA_INDEX_URL", "").split())
    if not index_flag and env.get("UV_INDEX_URL"):
        req.indexes.append(env["UV_INDEX_URL"])
    if env.get("UV_OFFLINE", "").lower() in ("1", "true"):
        req.offline = True
    return req


def _no_solution(reason: str) -> int:
    _err("  × No solution found when resolving dependencies:\n  ╰─▶ " + reason)
    return 1


def _resolve(st: HostState, spec: str, indexes: list[str]) -> str | int:
    """The version `spec` resolves to, or the exit status after uv's resolver error."""
    name, _, version = spec.partition("==")
    name = name.strip().lower()
    if any(c in name for c in "<>=!~ ;@["):
        _err(
            f"error: the simulator only handles `{PACKAGE}` and `{PACKAGE}==<version>`, "
            f"not `{spec}`"
        )
        return 2
    if name != PACKAGE:
        return _no_solution(
            f"Because {name} was not found in the package registry and you "
            f"require {name}, we can conclude that your requirements are "
            "unsatisfiable."
        )
    target = pk.wheel_of(st, version or st.config.latest_version, indexes)
    if not pk.served(st, PACKAGE, target, indexes):
        return _no_solution(
            f"Because there is no version of {spec} and you require {spec}, "
            "we can conclude that your requirements are unsatisfiable."
        )
    if st.faults.resolve_fails:
        return _no_solution(
            f"Because {PACKAGE}=={target} depends on torch==2.13.0 and torch==2.13.0 has no "
            "wheels with a matching platform tag (e.g., `manylinux_2_39_x86_64`), we can "
            f"conclude that {PACKAGE}=={target} cannot be used.\n"
            f"      And because you require {PACKAGE}=={target}, we can conclude that your "
            "requirements are unsatisfiable."
        )
    return target


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def _read_requirements(paths: list[str]) -> dict[str, str] | tuple[str, int]:
    """name -> version of the ``name==version`` lines of -r files (/dev/stdin too); or
    uv's error and exit status. Two pins of one name cannot both hold: uv 0.13.9 says
    so as tests/samples/uv_pip_sync_duplicate_pins.txt shows."""
    pins: dict[str, str] = {}
    for path in paths:
        try:
            text = sys.stdin.read() if path in ("-", "/dev/stdin") else Path(path).read_text()
        except OSError as e:
            return f"error: File not found: `{path}` ({e.strerror})", 2
        for line in text.splitlines():
            name, sep, version = line.strip().partition("==")
            name, version = name.strip().lower(), version.strip()
            if sep and pins.get(name, version) != version:
                return (
                    "error: No solution found when resolving dependencies\n  cause: "
                    f"Because you require {pk.pin(name, pins[name])} and "
                    f"{pk.pin(name, version)}, we can conclude that your requirements "
                    "are unsatisfiable."
                ), 1
            if sep:
                pins[name] = version
    return pins


def _changes(old: Mapping[str, str], new: Mapping[str, str], reinstall: bool) -> list[str]:
    """uv's ` - `/` + `/` ~ ` lines, by name."""
    lines = []
    for name in sorted(set(new) | set(old)):
        before, after = old.get(name), new.get(name)
        if after is None:
            continue  # uv pip install never removes; sync passes its own "old"
        if before == after:
            if reinstall:
                lines.append(f" ~ {pk.pin(name, after)}")
            continue
        if before is not None:
            lines.append(f" - {pk.pin(name, before)}")
        lines.append(f" + {pk.pin(name, after)}")
    return lines


def _missing(st: HostState, wanted: Mapping[str, str], req: _Request) -> list[str] | int:
    """The pins to download; or the exit status after uv's error for one it cannot get.
    Online, every wanted pin must be on the index (uv looks each up there, cached wheel
    or not); offline, only the cache counts."""
    cache = set(st.cache)
    for name, version in sorted(wanted.items()):
        p = pk.pin(name, version)
        if req.offline and p not in cache:
            _err(
                f"error: Failed to download `{p}`\n  Caused by: Network connectivity is "
                "disabled, but the requested data wasn't found in the cache for: "
                f"`{_wheel_url(req, name, version)}`"
            )
            return 2
        if not req.offline and not pk.served(st, name, version, req.indexes):
            return _no_solution(
                f"Because there is no version of {p} and you require {p}, "
                "we can conclude that your requirements are unsatisfiable."
            )
    return [pk.pin(n, v) for n, v in sorted(wanted.items()) if pk.pin(n, v) not in cache]


def _download(store: StateStore, need: list[str], t0: float) -> float:
    """Fetch the wheels into the cache, one after the other; returns when it ended."""
    cfg = store.read().config
    for p in need:
        name = p.partition("==")[0]
        if pk.size_mib(name) >= 1:
            _err(f"Downloading {name} ({pk.size_mib(name):.1f}MiB)")
    t = t0
    for p in need:
        name = p.partition("==")[0]
        t += cfg.download_delay_s + (
            pk.size_mib(name) / cfg.download_mib_per_s if cfg.download_mib_per_s > 0 else 0.0
        )
        _sleep_until(t)
        with store.transaction() as tx:
            if p not in tx.state.cache:
                tx.state = replace(tx.state, cache=(*tx.state.cache, p))
        if pk.size_mib(name) >= 1:
            _err(f" Downloaded {name}")
    return max(t, time.time())


def _install(store: StateStore, args: list[str]) -> int:
    req = _parse_install(args)
    if isinstance(req, str):
        return _unexpected(req, "install")
    t0 = time.time()
    st = store.read()
    problem = _python_error(req.python)
    if problem:
        _err(problem)
        return 2
    assert req.python is not None
    # A side-by-side venv's path leads to a release `uv venv` made: it is still the host's.
    if _throwaway(req.python) and not _ours(st, req.python):
        return _prefetch(store, req, t0)
    if not _ours(st, req.python):
        return _externally_managed(req.python)
    if len(req.specs) != 1:
        _err(
            "error: the following required arguments were not provided:\n  <PACKAGE>"
            if not req.specs
            else "error: the simulator installs one package spec at a time"
        )
        return 2
    duration = st.config.install_duration_s
    _sleep_until(t0 + 0.1 * duration)
    target = _resolve(st, req.specs[0], req.indexes)
    if isinstance(target, int):
        return target
    wanted = {**pk.release(st, target, req.indexes), PACKAGE: target}
    old = pk.environment(st)
    moved = {n: v for n, v in wanted.items() if old.get(n) != v}
    _err(f"Resolved {len(wanted)} packages in {_elapsed(time.time() - t0)}")
    if not moved and not req.reinstalls:
        _err("Would make no changes" if req.dry_run else f"Audited {len(wanted)} packages in 2ms")
        return 0
    # What is installed: every moved package, or all of them for a full reinstall.
    fetch = (
        wanted if req.reinstall_all else ({**moved, PACKAGE: target} if req.reinstalls else moved)
    )
    need = _missing(st, fetch, req)
    if isinstance(need, int):
        return need
    reinstall = req.reinstall_all or req.reinstalls
    lines = _changes(old, fetch if reinstall else moved, reinstall)
    if req.dry_run:
        removed = sum(1 for n in fetch if n in old)
        _err(f"Would download {_plural(len(need))}")
        if removed:
            _err(f"Would uninstall {_plural(removed)}")
        _err(f"Would install {_plural(len(fetch))}\n" + "\n".join(lines))
        return 0
    return _apply(store, req, target, fetch, need, lines, t0)


def _prefetch(store: StateStore, req: _Request, t0: float) -> int:
    """An install into a throwaway venv: the wheels reach the cache, nothing else changes."""
    pins = _read_requirements(req.requirements)
    if isinstance(pins, tuple):
        _err(pins[0])
        return pins[1]
    wanted = {**pins, **{n: v for n, _, v in (s.partition("==") for s in req.specs) if v}}
    st = store.read()
    _err(f"Resolved {_plural(len(wanted))} in {_elapsed(time.time() - t0)}")
    need = _missing(st, wanted, req)
    if isinstance(need, int):
        return need
    if _prefetch_fails(store):
        return _download_error(req, need[0] if need else pk.pin(PACKAGE, "?"))
    done = _download(store, need, time.time())
    _err(f"Prepared {_plural(len(wanted))} in {_elapsed(done - t0)}")
    _err(f"Installed {_plural(len(wanted))} in 41ms")
    _err("\n".join(f" + {pk.pin(n, v)}" for n, v in sorted(wanted.items())))
    # What the throwaway venv now holds, for its interpreter (bot.sim.tools.python).
    if req.python is not None:  # _throwaway(req.python) brought it here
        (Path(req.python).parent.parent / THROWAWAY_SET).write_text(json.dumps(wanted))
    return 0


def _stall(store: StateStore) -> float:
    """A download that makes no progress while the uv_stalls fault is set: only a
    signal ends it, with the venv untouched.  Returns the seconds it stalled."""
    start = time.time()
    while store.read().faults.uv_stalls:
        time.sleep(STALL_POLL_S)
    return time.time() - start


def _take_fault(store: StateStore, name: str) -> bool:
    """Whether the one-shot fault ``name`` (a ``Faults`` switch) is on; it is used up here,
    in the same transaction, so exactly one call sees it."""
    with store.transaction() as tx:
        on = bool(getattr(tx.state.faults, name))
        if on:
            tx.state = replace(tx.state, faults=replace(tx.state.faults, **{name: False}))
        return on


def _download_fails(store: StateStore) -> bool:
    """Whether this install hits the download fault (``uv_fails_always``: every one)."""
    return store.read().faults.uv_fails_always or _take_fault(store, "uv_fails")


def _prefetch_fails(store: StateStore) -> bool:
    return _take_fault(store, "prefetch_fails")


def _fails_midway(store: StateStore) -> bool:
    return _take_fault(store, "uv_fails_midway")


def _download_error(req: _Request, pinned: str) -> int:
    name, _, version = pinned.partition("==")
    _err(
        f"error: Failed to download `{pinned}`\n"
        "  Caused by: Request failed after 3 retries\n"
        f"  Caused by: error sending request for url ({_wheel_url(req, name, version)})\n"
        "  Caused by: client error (Connect)\n"
        "  Caused by: tcp connect error: Connection timed out (os error 110)"
    )
    return 2


def _wheel_url(req: _Request, name: str, version: str) -> str:
    base = (
        _without_credentials(req.indexes[0]).rstrip("/")
        if req.indexes
        else "https://files.pythonhosted.org/packages"
    )
    return f"{base}/{name}-{version.replace('+', '%2B')}-cp38-abi3-manylinux_2_31_x86_64.whl"


def _without_credentials(url: str) -> str:
    """As uv 0.13 prints an index URL in its errors: user and password left out
    (`error sending request for url (http://127.0.0.1:9/simple/...)` for an index given
    as http://alice:secret@127.0.0.1:9/simple)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def _stream_output(n: int, version: str, start: float, end: float) -> None:
    """The long download/build log benchmarks ask for, spread evenly from start to end."""
    lines = [f"Downloading {PACKAGE} (412.3MiB)"] + [
        f"      [{k}/{n - 1}] Building CUDA object CMakeFiles/_C.dir/csrc/"
        f"attention/paged_attention_v{k % 2 + 1}.cu.o ({PACKAGE}=={version})"
        for k in range(1, n)
    ]
    batches = min(OUTPUT_BATCHES, n)
    for b in range(batches):
        _sleep_until(start + (end - start) * b / batches)
        chunk = lines[b * n // batches : (b + 1) * n // batches]
        _write("".join(line + "\n" for line in chunk))


def _flood(chars: int) -> None:
    """One line of ``chars`` characters, written as fast as the reader takes it."""
    block = "C" * FLOOD_BLOCK
    for start in range(0, chars, FLOOD_BLOCK):
        _write(block[: min(FLOOD_BLOCK, chars - start)])
    _write("\n")


def _set_env(tx_state: HostState, env: Mapping[str, str]) -> HostState:
    """The state with exactly ``env`` installed (vllm in installed_version)."""
    others = {n: v for n, v in env.items() if n != PACKAGE}
    return replace(tx_state, packages=others, installed_version=env.get(PACKAGE))


def _apply(
    store: StateStore,
    req: _Request,
    target: str,
    fetch: Mapping[str, str],
    need: list[str],
    lines: list[str],
    t0: float,
) -> int:
    t0 += _stall(store)
    st = store.read()
    cfg = st.config
    if st.faults.uv_floods:
        _flood(cfg.flood_chars)
        t0 = time.time()  # the install's own timeline starts after the flood
    if _download_fails(store):
        _sleep_until(t0 + 0.4 * cfg.install_duration_s)
        return _download_error(req, pk.pin(PACKAGE, target))
    # The downloads come between resolving and preparing; the rest keeps its pace.
    began = time.time()
    shift = _download(store, need, began) - began
    at = [t0 + shift + f * cfg.install_duration_s for f in (0.1, 0.4, 0.7, 0.8, 1.0)]
    if cfg.install_output_lines:
        _stream_output(cfg.install_output_lines, target, at[0], at[2])
    _sleep_until(at[2])
    _err(f"Prepared {_plural(len(fetch))} in {_elapsed(time.time() - at[0])}")
    _sleep_until(at[3])
    with store.transaction() as tx:
        old = pk.environment(tx.state)
        # vllm goes first; its dependencies move with the "Installed" line.
        tx.state = replace(tx.state, installed_version=None)
    removed = sum(1 for n in fetch if n in old)
    if removed:
        _err(f"Uninstalled {_plural(removed)} in {_elapsed(time.time() - at[2])}")
    _sleep_until(at[4])
    midway = _fails_midway(store)
    with store.transaction() as tx:
        new = {**old, **fetch}
        if midway:
            del new[PACKAGE]
        tx.state = _set_env(tx.state, new)
    if midway:
        _err(
            f"error: Failed to install: {PACKAGE}-{target}-cp38-abi3-manylinux_2_31_x86_64."
            f"whl ({PACKAGE}=={target})\n  Caused by: failed to write to file `{st.venv}/lib/"
            "python3.12/site-packages/vllm/_C.abi3.so`: No space left on device (os error 28)"
        )
        return 2
    _err(f"Installed {_plural(len(fetch))} in {_elapsed(time.time() - at[3])}")
    _err("\n".join(lines))
    return 0


def _freeze(store: StateStore, args: list[str]) -> int:
    req = _parse_install(args)
    if isinstance(req, str) or req.specs:
        return _unexpected(req if isinstance(req, str) else req.specs[0], "freeze")
    st = store.read()
    problem = _python_error(req.python)
    if problem:
        _err(problem)
        return 2
    assert req.python is not None
    env = pk.environment(st) if _ours(st, req.python) else {}
    _err(f"Using Python 3.12.3 environment at: {os.path.dirname(os.path.dirname(req.python))}")
    pins = [pk.pin(n, v) for n, v in sorted(env.items())]
    if st.faults.duplicate_dist_info and env:
        # Both dist-infos, in name order, as uv lists them (uv_pip_freeze_duplicate_...).
        pins = sorted([*pins, *pk.DUPLICATE_PINS], key=lambda p: p.partition("==")[0])
    sys.stdout.write("".join(f"{p}\n" for p in pins))
    return 0


def _sync(store: StateStore, args: list[str]) -> int:
    """Make the environment exactly the file's pins (every other package removed)."""
    req = _parse_install(args)
    if isinstance(req, str):
        return _unexpected(req, "sync")
    t0 = time.time()
    st = store.read()
    problem = _python_error(req.python)
    if problem or not req.specs:
        _err(
            problem or "error: the following required arguments were not provided:\n  <SRC_FILE>..."
        )
        return 2
    assert req.python is not None
    if not _ours(st, req.python):
        return _externally_managed(req.python)
    wanted = _read_requirements(req.specs)
    if isinstance(wanted, tuple):
        _err(wanted[0])
        return wanted[1]
    _sleep_until(t0 + 0.1 * st.config.install_duration_s)
    _err(f"Resolved {_plural(len(wanted))} in {_elapsed(time.time() - t0)}")
    old = pk.environment(st)
    moved = {n: v for n, v in wanted.items() if old.get(n) != v}
    gone = {n: v for n, v in old.items() if n not in wanted}
    if not moved and not gone:
        _err(f"Checked {_plural(len(wanted))} in 3ms")
        return 0
    need = _missing(st, moved, req)
    if isinstance(need, int):
        return need
    if _download_fails(store):
        return _download_error(req, need[0] if need else pk.pin(*next(iter(moved.items()))))
    done = _download(store, need, time.time())
    _sleep_until(done + 0.5 * st.config.install_duration_s)
    with store.transaction() as tx:
        tx.state = _set_env(tx.state, wanted)
    if gone or any(n in old for n in moved):
        _err(f"Uninstalled {_plural(len(gone) + sum(1 for n in moved if n in old))} in 12ms")
    if moved:
        _err(f"Installed {_plural(len(moved))} in 30ms")
    lines = [f" - {pk.pin(n, v)}" for n, v in sorted(gone.items())]
    lines += _changes(old, moved, False)
    _err("\n".join(sorted(lines, key=lambda x: (x[3:].split("==")[0], x[1] == "+"))))
    return 0


def _venv(args: list[str]) -> int:
    """``uv venv [--quiet] [--python P] PATH``: a venv whose installs only fill the cache."""
    path: str | None = None
    quiet = False
    it = iter(args)
    for a in it:
        if a in ("--python", "-p"):
            next(it, "")
        elif a in ("--quiet", "-q"):
            quiet = True
        elif a.startswith("-"):
            _err(f"error: unexpected argument '{a}' found")
            return 2
        else:
            path = a
    if path is None:
        path = ".venv"
    make_venv(Path(path))
    if not quiet:
        _err(
            f"Using CPython 3.12.3\nCreating virtual environment at: {path}\n"
            f"Activate with: source {path}/bin/activate"
        )
    return 0


def make_venv(venv: Path) -> None:
    """What ``uv venv`` lays out: the interpreter's launcher and ``pyvenv.cfg``."""
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    # The throwaway venv's interpreter: the simulated one (bot.sim.tools.python) over what
    # was installed into this venv (THROWAWAY_SET), so a gate run with it sees the new build.
    # The host's state directory (and the Python running the simulator) as this uv
    # found them, kept in the launcher as bot.sim's tool wrappers keep them (a sudo
    # host's environment is reset).
    sim = Path(__file__).resolve().parents[1]
    root = sim.parent.parent  # the repository: bot.sim importable
    keep = "".join(
        f"{k}={shlex.quote(os.environ[k])}; export {k}\n"
        for k in ("SIM_STATE_DIR", "SIM_PYTHON")
        if os.environ.get(k)
    )
    # Its `vllm` too (bot.sim.tools.venv_vllm): the help of the vllm installed into it.
    for name, tool in (("python", "venv-python"), ("vllm", "venv-vllm")):
        (venv / "bin" / name).write_text(
            f"#!/bin/sh\n# Simulated throwaway-venv {name} (bot/sim/tools/{tool}).\n"
            + keep
            + 'if [ -x "${SIM_FORK_CLIENT:-}" ]; then\n'
            f'  PYTHONPATH="{root}" exec "$SIM_FORK_CLIENT" -S "{sim}/forkclient.py" '
            f'{tool} "{venv.resolve()}" "$@"\nfi\n'
            f'PYTHONPATH="{root}" exec "${{SIM_PYTHON:-python3}}" -S "{sim}/forkclient.py" '
            f'{tool} "{venv.resolve()}" "$@"\n'
        )
        (venv / "bin" / name).chmod(0o755)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion_info = 3.12.3\n" + VENV_MARK)


def _query_interpreter(store: StateStore, args: list[str]) -> None:
    """Real uv starts the interpreter ``--python`` names to learn about it (on a miss of
    its cache), which runs the venv's ``.pth`` files (``bot.sim.pth``)."""
    if "--python" not in args:
        return
    named = args[args.index("--python") + 1 :][:1]
    venv = store.read().venv
    if named == [f"{venv}/bin/python"]:
        pth.run_pth(venv)


def main(store: StateStore, args: list[str]) -> int:
    if args in (["--version"], ["-V"], ["version"]):
        print(UV_VERSION)
        return 0
    _query_interpreter(store, args)
    if args[:1] == ["venv"]:
        return _venv(args[1:])
    subs = {"install": _install, "freeze": _freeze, "sync": _sync}
    if len(args) >= 2 and args[0] == "pip" and (args[1] in subs or args[1] == "show"):
        return _show(store, args[2:]) if args[1] == "show" else subs[args[1]](store, args[2:])
    sub = " ".join(args[:2]) or "(none)"
    _err(
        f"error: unrecognized subcommand '{sub}'\n\nUsage: uv [OPTIONS] <COMMAND>\n\n"
        "For more information, try '--help'."
    )
    return 2
