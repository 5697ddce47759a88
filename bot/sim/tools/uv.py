"""Simulated ``uv``: ``uv pip show`` and ``uv pip install`` of the one package that moves, vllm.

Like uv 0.9, everything but ``pip show`` reports on stderr.  A real install
streams its progress over ``install_duration_s``; the old version is gone from
the "Uninstalled" line until the "Installed" one, so an install killed in
between leaves vllm missing, as it would on a real host.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit, urlunsplit

from bot.sim.state import HostState, StateStore

UV_VERSION = "uv 0.9.5"
PACKAGE = "vllm"
RESOLVED = 152
REQUIRES = (
    "aiohttp, blake3, cachetools, cloudpickle, compressed-tensors, depyf, einops, fastapi, "
    "filelock, gguf, lark, llguidance, lm-format-enforcer, mistral-common, msgspec, ninja, "
    "numba, numpy, openai, opencv-python-headless, outlines-core, partial-json-parser, pillow, "
    "prometheus-client, protobuf, psutil, py-cpuinfo, pybase64, pydantic, pyyaml, pyzmq, ray, "
    "regex, requests, scipy, sentencepiece, setproctitle, setuptools, six, tiktoken, "
    "tokenizers, torch, torchaudio, torchvision, tqdm, transformers, typing-extensions, "
    "watchfiles, xgrammar"
)
NO_VENV = ("error: No virtual environment found; run `uv venv` to create an environment, "
           "or pass `--system` to install into a non-virtual environment")
OUTPUT_BATCHES = 50
FLOOD_BLOCK = 1024 * 1024
STALL_POLL_S = 0.05


def _elapsed(seconds: float) -> str:
    """uv's own duration format: 812ms, 1.31s, 2m 05s."""
    if seconds >= 60:
        return f"{int(seconds) // 60}m {int(seconds) % 60:02d}s"
    if seconds >= 1:
        return f"{int(seconds)}.{int(seconds * 100) % 100:02d}s"
    return f"{int(seconds * 1000)}ms"


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
        return (f"error: Failed to inspect Python interpreter from provided path at `{python}`\n"
                "  Caused by: Failed to query Python interpreter\n"
                "  Caused by: No such file or directory (os error 2)")
    return None


def _ours(st: HostState, python: str) -> bool:
    return os.path.realpath(python) == os.path.realpath(st.python)


def _unexpected(arg: str, sub: str) -> int:
    _err(f"error: unexpected argument '{arg}' found\n\n"
         f"Usage: uv pip {sub} [OPTIONS] <PACKAGE>\n\nFor more information, try '--help'.")
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
        blocks.append(f"Name: {PACKAGE}\nVersion: {version}\n"
                      f"Location: {st.venv}/lib/python3.12/site-packages\n"
                      f"Requires: {REQUIRES}\nRequired-by:\n")
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
    reinstall: set[str] = field(default_factory=set)
    indexes: list[str] = field(default_factory=list)
    specs: list[str] = field(default_factory=list)

    @property
    def reinstalls(self) -> bool:
        return self.reinstall_all or PACKAGE in self.reinstall


_VALUE_OPTIONS = ("--python", "-p", "--reinstall-package", "--extra-index-url", "--index-url",
                  "-i")


def _parse_install(args: list[str], env: Mapping[str, str] = os.environ
                   ) -> _Request | str:
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
        elif key in ("--extra-index-url", "--index-url", "-i"):
            req.indexes.append(val)
            extra_flag |= key == "--extra-index-url"
            index_flag |= key != "--extra-index-url"
        elif a == "--dry-run":
            req.dry_run = True
        elif a in ("--force-reinstall", "--reinstall"):
            req.reinstall_all = True
        elif a.startswith("-"):
            return a
        else:
            req.specs.append(a)
    # As uv's clap options do: the variable stands in for its flag when the flag is absent
    # (UV_EXTRA_INDEX_URL holds space-separated URLs).
    if not extra_flag:
        req.indexes.extend(env.get("UV_EXTRA_INDEX_URL", "").split())
    if not index_flag and env.get("UV_INDEX_URL"):
        req.indexes.append(env["UV_INDEX_URL"])
    return req


def _no_solution(reason: str) -> int:
    _err("  × No solution found when resolving dependencies:\n  ╰─▶ " + reason)
    return 1


def _resolve(st: HostState, spec: str, indexes: list[str]) -> str | int:
    """The version `spec` resolves to, or the exit status after uv's resolver error."""
    name, _, version = spec.partition("==")
    name = name.strip().lower()
    if any(c in name for c in "<>=!~ ;@["):
        _err(f"error: the simulator only handles `{PACKAGE}` and `{PACKAGE}==<version>`, "
             f"not `{spec}`")
        return 2
    if name != PACKAGE:
        return _no_solution(f"Because {name} was not found in the package registry and you "
                            f"require {name}, we can conclude that your requirements are "
                            "unsatisfiable.")
    target = version or st.config.latest_version
    versions = st.config.available_versions
    if st.config.index_url and st.config.index_url in indexes:
        versions += st.config.index_versions
    if target not in versions:
        return _no_solution(f"Because there is no version of {spec} and you require {spec}, "
                            "we can conclude that your requirements are unsatisfiable.")
    if st.faults.resolve_fails:
        return _no_solution(
            f"Because {PACKAGE}=={target} depends on torch==2.10.0 and torch==2.10.0 has no "
            "wheels with a matching platform tag (e.g., `manylinux_2_39_x86_64`), we can "
            f"conclude that {PACKAGE}=={target} cannot be used.\n"
            f"      And because you require {PACKAGE}=={target}, we can conclude that your "
            "requirements are unsatisfiable.")
    return target


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


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
    if not _ours(st, req.python):
        _err(f"error: The interpreter at {os.path.dirname(os.path.dirname(req.python))} is "
             "externally managed, and indicates the following:\n\n"
             "  To install Python packages system-wide, try apt install python3-xyz")
        return 2
    if len(req.specs) != 1:
        _err("error: the following required arguments were not provided:\n  <PACKAGE>"
             if not req.specs else "error: the simulator installs one package spec at a time")
        return 2
    duration = st.config.install_duration_s
    _sleep_until(t0 + 0.1 * duration)
    target = _resolve(st, req.specs[0], req.indexes)
    if isinstance(target, int):
        return target
    _err(f"Resolved {RESOLVED} packages in {_elapsed(time.time() - t0)}")
    old = st.installed_version
    if old == target and not req.reinstalls:
        _err("Would make no changes" if req.dry_run else "Audited 1 package in 2ms")
        return 0
    if req.dry_run:
        _err("Would download 1 package")
        if old is not None:
            _err("Would uninstall 1 package")
        _err("Would install 1 package")
        if old is not None:
            _err(f" - {PACKAGE}=={old}")
        _err(f" + {PACKAGE}=={target}")
        return 0
    return _apply(store, req, target, t0)


def _stall(store: StateStore) -> float:
    """A download that makes no progress while the uv_stalls fault is set: only a
    signal ends it, with the venv untouched.  Returns the seconds it stalled."""
    start = time.time()
    while store.read().faults.uv_stalls:
        time.sleep(STALL_POLL_S)
    return time.time() - start


def _download_fails(store: StateStore) -> bool:
    """Whether this install hits the download fault; the one-shot fault is used up here."""
    with store.transaction() as tx:
        faults = tx.state.faults
        if faults.uv_fails and not faults.uv_fails_always:
            tx.state = replace(tx.state, faults=replace(faults, uv_fails=False))
        return faults.uv_fails or faults.uv_fails_always


def _wheel_url(req: _Request, version: str) -> str:
    base = (_without_credentials(req.indexes[0]).rstrip("/") if req.indexes
            else "https://files.pythonhosted.org/packages")
    return f"{base}/{PACKAGE}-{version.replace('+', '%2B')}-cp38-abi3-manylinux_2_31_x86_64.whl"


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
        for k in range(1, n)]
    batches = min(OUTPUT_BATCHES, n)
    for b in range(batches):
        _sleep_until(start + (end - start) * b / batches)
        chunk = lines[b * n // batches:(b + 1) * n // batches]
        _write("".join(line + "\n" for line in chunk))


def _flood(chars: int) -> None:
    """One line of ``chars`` characters, written as fast as the reader takes it."""
    block = "C" * FLOOD_BLOCK
    for start in range(0, chars, FLOOD_BLOCK):
        _write(block[:min(FLOOD_BLOCK, chars - start)])
    _write("\n")


def _apply(store: StateStore, req: _Request, target: str, t0: float) -> int:
    t0 += _stall(store)
    st = store.read()
    cfg = st.config
    if st.faults.uv_floods:
        _flood(cfg.flood_chars)
        t0 = time.time()  # the install's own timeline starts after the flood
    at = [t0 + f * cfg.install_duration_s for f in (0.1, 0.4, 0.7, 0.8, 1.0)]
    if _download_fails(store):
        _sleep_until(at[1])
        _err(f"error: Failed to download `{PACKAGE}=={target}`\n"
             "  Caused by: Request failed after 3 retries\n"
             f"  Caused by: error sending request for url ({_wheel_url(req, target)})\n"
             "  Caused by: client error (Connect)\n"
             "  Caused by: tcp connect error: Connection timed out (os error 110)")
        return 2
    if cfg.install_output_lines:
        _stream_output(cfg.install_output_lines, target, at[0], at[2])
    _sleep_until(at[2])
    _err(f"Prepared 1 package in {_elapsed(time.time() - at[0])}")
    _sleep_until(at[3])
    with store.transaction() as tx:
        old = tx.state.installed_version
        tx.state = replace(tx.state, installed_version=None)
    if old is not None:
        _err(f"Uninstalled 1 package in {_elapsed(time.time() - at[2])}")
    _sleep_until(at[4])
    with store.transaction() as tx:
        tx.state = replace(tx.state, installed_version=target)
    _err(f"Installed 1 package in {_elapsed(time.time() - at[3])}")
    _err(f" ~ {PACKAGE}=={target}" if old == target
         else (f" - {PACKAGE}=={old}\n" if old else "") + f" + {PACKAGE}=={target}")
    return 0


def main(store: StateStore, args: list[str]) -> int:
    if args in (["--version"], ["-V"], ["version"]):
        print(UV_VERSION)
        return 0
    if len(args) >= 2 and args[0] == "pip" and args[1] in ("show", "install"):
        return _show(store, args[2:]) if args[1] == "show" else _install(store, args[2:])
    sub = " ".join(args[:2]) or "(none)"
    _err(f"error: unrecognized subcommand '{sub}'\n\nUsage: uv [OPTIONS] <COMMAND>\n\n"
         "For more information, try '--help'.")
    return 2
