"""The ``vllm`` command of a throwaway venv ``uv venv`` made (the bot's prefetch):
``venv-vllm VENV serve --help[=all]``. It prints the help of the vllm installed into that
venv (the set bot.sim.tools.uv recorded there), in the shape of current vLLM's
(tests/samples/vllm_help/serve_help_all_0.33.0.txt, the real ``vllm serve --help=all``
of vLLM 0.33.0; vllm-project/vllm-omni#744 for plain ``--help``, which lists only the
groups): grouped, choices as argparse prints them (``{a,b}``) or as vLLM prints the
values it knows of an open option (``['a', 'b']``), ``--optimization-level`` and no
``-O``. With the removed_flag fault, a build other than the one the host booted with no
longer lists ``--task``; with removed_value, it no longer lists ``xxhash`` among
``--prefix-caching-hash-algo``'s choices (vLLM 0.10.2 lists only ``{sha256,sha256_cbor}``).
Anything but the help is refused: the bot never serves from that venv."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from bot.sim.state import REMOVED_VALUE, StateStore, refused_flags, value_removed
from bot.sim.tools.uv import throwaway_set

_USAGE = "usage: vllm serve [model_tag] [options]"
_INTRO = [
    _USAGE,
    "",
    "Launch a local OpenAI-compatible API server to serve LLM",
    "completions via HTTP. Defaults to Qwen/Qwen3-0.6B if no model is specified.",
    "",
    "Search by using: `--help=<ConfigGroup>` to explore options by section (e.g.,",
    "--help=ModelConfig, --help=Frontend)",
    "  Use `--help=all` to show all available flags at once.",
    "",
]
_GROUPS = [
    ("options", ""),
    ("Frontend", "Arguments for the OpenAI-compatible frontend server."),
    ("ModelConfig", "Configuration for the model."),
    ("CacheConfig", "Configuration for the KV cache."),
    ("ParallelConfig", "Configuration for the distributed execution."),
    ("VllmConfig", "Dataclass which contains all vllm-related configuration."),
]
# (group, option names with metavar, description); wrapped as argparse wraps them.
_OPTIONS: list[tuple[str, str, str]] = [
    (
        "options",
        "--api-server-count API_SERVER_COUNT, -asc API_SERVER_COUNT",
        "How many API server processes to run. (default: 1)",
    ),
    ("options", "--config CONFIG", "Read CLI options from a config file. (default: None)"),
    ("options", "--disable-log-stats", "Disable logging statistics. (default: False)"),
    ("options", "--headless", "Run in headless mode. (default: False)"),
    ("options", "-h, --help", "show this help message and exit"),
    (
        "Frontend",
        "--allow-credentials, --no-allow-credentials",
        "Allow credentials. (default: False)",
    ),
    (
        "Frontend",
        "--api-key API_KEY [API_KEY ...]",
        "If provided, the server will require one of these keys to be presented in the "
        "header. (default: None)",
    ),
    ("Frontend", "--host HOST", "Host name. (default: None)"),
    ("Frontend", "--port PORT", "Port number. (default: 8000)"),
    ("Frontend", "--uds UDS", "Unix domain socket path. (default: None)"),
    (
        "ModelConfig",
        "--model MODEL",
        "Name or path of the Hugging Face model to use. (default: Qwen/Qwen3-0.6B)",
    ),
    (
        "ModelConfig",
        "--served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]",
        "The model name(s) used in the API. (default: None)",
    ),
    (
        "ModelConfig",
        "--task {auto,classify,draft,embed,embedding,generate,reward,score,transcription}",
        "[DEPRECATED] The task to use the model for. (default: None)",
    ),
    (
        "ModelConfig",
        "--dtype {auto,bfloat16,float,float16,float32,half}",
        "Data type for model weights and activations. (default: auto)",
    ),
    (
        "ModelConfig",
        "--tokenizer-mode ['auto', 'deepseek_v32', 'hf', 'mistral']",
        "Tokenizer mode. (default: auto)",
    ),
    (
        "ModelConfig",
        "--max-model-len MAX_MODEL_LEN",
        "Model context length (prompt and output). Supports k/m/g/K/M/G in human-readable "
        "format. Examples: - 1k -> 1000 - 1K -> 1024 (default: None)",
    ),
    (
        "ModelConfig",
        "--trust-remote-code, --no-trust-remote-code",
        "Trust remote code (e.g., from HuggingFace) when downloading the model and "
        "tokenizer. (default: False)",
    ),
    (
        "CacheConfig",
        "--prefix-caching-hash-algo {sha256,sha256_cbor,xxhash,xxhash_cbor}",
        "Set the hash algorithm for prefix caching. (default: sha256)",
    ),
    (
        "ParallelConfig",
        "--tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE",
        "Number of tensor parallel groups. (default: 1)",
    ),
    (
        "ParallelConfig",
        "--pipeline-parallel-size PIPELINE_PARALLEL_SIZE, -pp PIPELINE_PARALLEL_SIZE",
        "Number of pipeline parallel groups. (default: 1)",
    ),
    (
        "ParallelConfig",
        "--enable-expert-parallel, --no-enable-expert-parallel",
        "Use expert parallelism instead of tensor parallelism for MoE layers. (default: False)",
    ),
    (
        "VllmConfig",
        "--compilation-config COMPILATION_CONFIG, -cc COMPILATION_CONFIG",
        "torch.compile and cudagraph capture configuration for the model. (default: {})",
    ),
    (
        "VllmConfig",
        "--optimization-level OPTIMIZATION_LEVEL",
        "The optimization level. These levels trade startup time cost for performance, "
        "with -O0 having the best startup time and -O3 having the best performance. -O2 "
        "is used by default. (default: 2)",
    ),
]


def _wrap(text: str, width: int = 56) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + ([line] if line else [])


def _names(names: str, dropped: tuple[str, ...]) -> str:
    """An option's names with the values a build no longer lists left out."""
    for value in dropped:
        names = names.replace(f",{value}}}", "}").replace(f"{{{value},", "{")
        names = names.replace(f",{value},", ",")
    return names


def _all(removed: tuple[str, ...], dropped: Mapping[str, tuple[str, ...]]) -> str:
    out = [_USAGE, "", "Start the vLLM OpenAI Compatible API server.", ""]
    out += ["positional arguments:", "  model_tag             The model tag to serve", ""]
    for group, about in _GROUPS:
        out.append(f"{group}:")
        if about:
            out += [f"  {about}", ""]
        for g, names, text in _OPTIONS:
            name = names.split(" ", 1)[0].rstrip(",")
            if g != group or name in removed:
                continue
            names = _names(names, dropped.get(name, ()))
            desc = _wrap(text)
            if len(names) <= 20:
                out.append(f"  {names:<22}{desc[0]}")
                desc = desc[1:]
            else:
                out.append(f"  {names}")
            out += [" " * 24 + d for d in desc]
        out.append("")
    return "\n".join(out)


def _summary() -> str:
    rows = [f"  {name:<24}{about}" for name, about in _GROUPS]
    return "\n".join([*_INTRO, "Config Groups:", *rows, ""])


def main(store: StateStore, args: list[str]) -> int:
    if not args:
        print("venv-vllm: no venv named", file=sys.stderr)
        return 2
    venv, rest = Path(args[0]), args[1:]
    version = throwaway_set(venv).get("vllm")
    if version is None:
        print(f"{venv}/bin/vllm: ModuleNotFoundError: No module named 'vllm'", file=sys.stderr)
        return 1
    if rest == ["serve", "--help=all"]:
        st = store.read()
        dropped = {REMOVED_VALUE[0]: (REMOVED_VALUE[1],)} if value_removed(st, version) else {}
        print(_all(refused_flags(st, version), dropped))
        return 0
    if rest in (["serve", "--help"], ["serve", "-h"]):
        print(_summary())
        return 0
    print(f"venv-vllm: only `serve --help` is simulated here, not {rest}", file=sys.stderr)
    return 2
