"""The unit's environment and ExecStart's `$` words, expanded as systemd does, on what the
real systemd 252 printed and passed (tests/samples/systemd_env/, SOURCES.md: a user
manager of Debian 12's systemd 252.38 ran vllm-capture.service, whose ExecStart is
/usr/bin/printf, so argv_252.txt is the argv systemd built)."""

from __future__ import annotations

import re
from pathlib import Path

from bot.core.remote import parse_unit_show
from bot.core.unit_env import (
    EnvFile,
    UnitEnvironment,
    environment_files,
    expand,
    parse_env_file,
    parse_environment,
    split_words,
)
from bot.core.unit_flags import ServeCommand, command_of, judge_flags, parse_help

SAMPLES = Path(__file__).parent / "samples"
SHOW = (SAMPLES / "systemd_env/systemctl_show_exec_env_252.txt").read_text()
ENV_FILE = (SAMPLES / "systemd_env/vllm.env").read_text()
# The words printf got after its format: `[%s]` around each.
REAL_ARGV = re.findall(r"\[([^]]*)\]", (SAMPLES / "systemd_env/argv_252.txt").read_text())


def test_environment_as_systemctl_show_prints_it() -> None:
    props = parse_unit_show(SHOW)
    assert parse_environment(props["Environment"]) == {
        "HF_HOME": "/srv/hf",
        "SERVED": "--served-model-name kimi k2",  # printed "SERVED=--served-model-name kimi k2"
        "QUOTE": 'say "hi"',  # printed "QUOTE=say \"hi\""
        "DOLLAR": "a$$b",  # printed "DOLLAR=a\$\$b": Environment= keeps $$ as it is
        "EMPTY": "",
    }
    assert environment_files(SHOW) == (
        EnvFile("/tmp/vflags-sd/cap/vllm.env", ignore_errors=False),
        EnvFile("/tmp/vflags-sd/cap/missing.env", ignore_errors=True),
    )
    # systemctl before 248 printed each assignment unquoted: a value's spaces cannot be
    # told from the separators, so nothing is read from it.
    assert parse_environment("VLLM_ARGS=--max-num-seqs 64") is None
    assert parse_environment("") == {}


def test_an_environment_file_as_systemd_reads_it() -> None:
    assert parse_env_file(ENV_FILE) == {
        "HF_TOKEN": "hf_not_a_real_token",
        "VLLM_ARGS": "--max-num-seqs 64 --tokenizer-mode slow",
        "SPACED": "--dtype   bfloat16",
        "SINGLE": "--quantization fp8",
        "JSON": "--override-generation-config '{\"temperature\": 0.6}' --kv-cache-dtype fp8",
        "CONT": "--enable-prefix-caching --max-model-len 32k",
        # `export EXPORTED=--task`: no valid name, systemd drops it.
    }
    # A comment ending in `\`: systemd up to 253 takes the next line into it, 254 reads
    # it: which one the host runs is not known, so nothing is taken from the file.
    assert parse_env_file("# a comment \\\nVLLM_ARGS=--task\n") is None
    assert parse_env_file("A=1\n# a comment \\ here\nB=2") == {"A": "1", "B": "2"}


def test_execstart_expands_to_what_systemd_passed() -> None:
    props = parse_unit_show(SHOW)
    env_values = parse_environment(props["Environment"])
    file_values = parse_env_file(ENV_FILE)
    assert env_values is not None and file_values is not None
    env = UnitEnvironment({**env_values, **file_values})
    argv = re.search(r"argv\[\]=(.*?) ; ", props["ExecStart"])
    assert argv is not None
    expanded = expand(argv[1].split(), env)
    # $EXPORTED ${EXPORTED} $UNSET ${UNSET}: the unit sets neither, so the manager's own
    # environment might (here it did not: printf got nothing, "", nothing, ""). They are
    # kept as written and said as unknown, never guessed.
    unknown = {expanded.words[i]: why for i, why in expanded.unknown}
    assert set(unknown) == {"$EXPORTED", "${EXPORTED}", "$UNSET", "${UNSET}"}
    assert unknown["$UNSET"].startswith("the unit sets no UNSET (it may come from the service")
    known = [w for i, w in enumerate(expanded.words) if i not in dict(expanded.unknown)]
    # What systemd passed, less the two empty words of ${EXPORTED} and ${UNSET}.
    passed = list(REAL_ARGV)
    at = passed.index("32k") + 1
    assert passed[at : at + 2] == ["", ""]
    del passed[at : at + 2]
    assert known[:2] == ["/usr/bin/printf", "[%s]"]
    assert known[2:] == passed


def test_words_split_as_systemd_splits_a_value() -> None:
    assert split_words('--a \'b c\'  "d \\" e" f\\ g') == ["--a", "b c", 'd " e', "f g"]
    assert split_words("  ") == [] and split_words("''") == [""]
    assert split_words("'unbalanced") == ["unbalanced"]


def test_an_unreadable_file_makes_every_variable_unknown() -> None:
    # Any variable may be set (or overridden) in the file that could not be read.
    env = UnitEnvironment(
        {"VLLM_ARGS": "--task generate"},
        ("/etc/default/vllm could not be read (exit 1: Permission denied)",),
    )
    expanded = expand(("vllm", "serve", "m", "$VLLM_ARGS", "${HF_HOME}/x", "$$"), env)
    assert expanded.words == ("vllm", "serve", "m", "$VLLM_ARGS", "${HF_HOME}/x", "$")
    assert [i for i, _ in expanded.unknown] == [3, 4]
    assert "Permission denied" in expanded.unknown[0][1]


HELP = parse_help(
    [
        "  --port PORT           Port number. (default: 8000)",
        "  --max-num-seqs MAX_NUM_SEQS",
        "  --served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]",
        "  --dtype {auto,bfloat16,float,float16,float32,half}",
    ]
)
EXEC = (
    "{ path=/opt/venvs/vllm/bin/vllm ; argv[]=/opt/venvs/vllm/bin/vllm serve /models/m "
    "--port 8000 $VLLM_ARGS ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; "
    "pid=0 ; code=(null) ; status=0/0 }"
)


def test_flags_in_a_variable_are_judged_and_never_said_as_none() -> None:
    env = UnitEnvironment({"VLLM_ARGS": "--max-num-seqs 64 --task generate"})
    command = command_of(EXEC, env)
    assert isinstance(command, ServeCommand)
    assert command.flags == ("--port", "--max-num-seqs", "--task")
    verdict = judge_flags(command, HELP, "vllm", "0.33.0")
    assert verdict.outcome == "refused" and verdict.refused == ("--task",)


def test_a_variable_whose_value_is_not_known_is_unchecked() -> None:
    unread = UnitEnvironment(unread=("/etc/default/vllm could not be read (exit 1)",))
    command = command_of(EXEC, unread)
    assert isinstance(command, ServeCommand)
    verdict = judge_flags(command, HELP, "vllm", "0.33.0")
    assert verdict.outcome == "unchecked"
    assert verdict.reason == (
        "`$VLLM_ARGS`: /etc/default/vllm could not be read (exit 1); every flag read (1) "
        "is accepted by vllm 0.33.0"
    )
    # Not read at all (no environment given): the same, never "accepted (1 flag)".
    bare = command_of(EXEC)
    assert isinstance(bare, ServeCommand)
    assert judge_flags(bare, HELP, "vllm", "0.33.0").outcome == "unchecked"
    # A value word whose variable is unknown cannot hold a flag: it does not matter...
    words = command_of(EXEC.replace("$VLLM_ARGS", "--served-model-name /m/${NAME}"), unread)
    assert isinstance(words, ServeCommand)
    assert judge_flags(words, HELP, "vllm", "0.33.0").outcome == "accepted"
    # ... unless it is a value the help lists choices for.
    dtype = command_of(EXEC.replace("$VLLM_ARGS", "--dtype ${DTYPE}"), unread)
    assert isinstance(dtype, ServeCommand)
    verdict = judge_flags(dtype, HELP, "vllm", "0.33.0")
    assert verdict.outcome == "unchecked"
    assert verdict.reason == (
        "`--dtype ${DTYPE}`: /etc/default/vllm could not be read (exit 1); every flag read "
        "(2) is accepted by vllm 0.33.0"
    )


def test_an_executable_from_a_variable_is_not_known() -> None:
    command = command_of(EXEC.replace("argv[]=/opt/venvs/vllm/bin/vllm", "argv[]=$VLLM"))
    assert command == (
        "the unit's command is not known (the unit's Environment= and EnvironmentFiles "
        "were not read)"
    )
