"""The unit's flags and their values against the new vLLM's own help, on real captures
(tests/samples/SOURCES.md: vllm#10017, achatbot#191, vllm-omni#744, systemd#16051, and
the real helps and parsers of vLLM 0.33.0 and 0.10.2)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bot.core.remote import parse_unit_show, serve_help
from bot.core.unit_flags import (
    HELP_BEGIN,
    HELP_END,
    HELP_FAILED,
    FlagVerdict,
    ServeCommand,
    help_section,
    judge_flags,
    parse_exec_start,
    parse_help,
    parse_help_options,
    serve_command,
    step_note,
)

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> list[str]:
    return (SAMPLES / name).read_text().splitlines()


def test_the_flat_help_lists_its_options_and_nothing_from_descriptions() -> None:
    options = parse_help_options(sample("vllm_help/serve_help_flat_pr10017.txt"))
    assert options == {
        "--allow-credentials",
        "--allowed-headers",
        "--allowed-local-media-path",
        "--allowed-methods",
        "--allowed-origins",
        "--api-key",
        "--block-size",
        "--chat-template",
        "--chat-template-text-format",
    }


def test_the_grouped_help_lists_pairs_and_short_aliases() -> None:
    options = parse_help_options(sample("vllm_help/serve_help_grouped_achatbot191.txt"))
    for name in ("--api-server-count", "-asc", "--no-disable-log-requests", "-h", "--help"):
        assert name in options
    assert "--allow-credentials" in options and "--no-allow-credentials" in options
    # The description's words and the positional argument are no options.
    assert "model_tag" not in options and not any("docs.vllm" in o for o in options)


def test_the_summary_help_lists_no_options_so_nothing_is_judged() -> None:
    options = parse_help_options(sample("vllm_help/serve_help_summary_omni744.txt"))
    # The example lines (`vllm serve ... --omni --port 8091`) are not option lines.
    assert "--port" not in options
    verdict = judge_flags(ServeCommand("vllm", ("--task",)), options, "vllm", "0.11.0")
    assert verdict.outcome == "unchecked"
    assert "listed no options" in verdict.reason


def test_a_real_exec_start_that_is_not_vllm_serve_is_not_checkable() -> None:
    props = parse_unit_show("\n".join(sample("systemctl_show_execstart_16051.txt")))
    argv = parse_exec_start(props["ExecStart"])
    assert argv == ("/usr/lib/systemd/systemd-logind",)
    why = serve_command(argv)
    assert isinstance(why, str) and "does not start `vllm serve`" in why


def test_a_vllm_exec_start_gives_its_flags_and_not_its_values() -> None:
    value = (
        "{ path=/opt/venvs/vllm/bin/vllm ; argv[]=/opt/venvs/vllm/bin/vllm serve "
        "/models/Kimi-K2.5 --tensor-parallel-size 8 --port=8000 --override-generation-config "
        '{"temperature": -1} -O3 ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; '
        "pid=0 ; code=(null) ; status=0/0 }"
    )
    argv = parse_exec_start(value)
    assert argv is not None
    command = serve_command(argv)
    assert isinstance(command, ServeCommand)
    assert command.executable == "/opt/venvs/vllm/bin/vllm"
    assert command.flags == (
        "--tensor-parallel-size",
        "--port=8000",
        "--override-generation-config",
        "-O3",
    )
    # Through env(1), still `vllm serve`; a shell wrapper is not.
    assert isinstance(serve_command(("/usr/bin/env", "HF_HOME=/x", *argv)), ServeCommand)
    assert isinstance(serve_command(("/bin/bash", "-c", "exec vllm serve m")), str)
    assert parse_exec_start("") is None


ACCEPTED = frozenset(
    {
        "--port",
        "--tensor-parallel-size",
        "-tp",
        "--max-model-len",
        "--max-num-seqs",
        "--compilation-config",
        "-O",
        "--config",
        "--served-model-name",
    }
)


@pytest.mark.parametrize(
    "flag",
    [
        "--port",
        "--max_model_len",  # FlexibleArgumentParser: underscores read as dashes
        "--port=8000",
        "--compilation-config.level=3",  # a JSON option by its keys
        "-tp",
        "-O3",  # a short option with its value attached
        "--tensor-parallel",  # argparse: a unique prefix
        "--served",
    ],
)
def test_what_the_parser_takes_is_accepted(flag: str) -> None:
    verdict = judge_flags(ServeCommand("vllm", (flag,)), ACCEPTED, "vllm", "0.21.0")
    assert verdict.outcome == "accepted", verdict


@pytest.mark.parametrize("flag", ["--task", "--max", "--model", "-q", "--port-x"])
def test_what_the_parser_refuses_is_refused_by_name(flag: str) -> None:
    # `--max` is a prefix of two options: argparse calls it ambiguous and exits.
    command = ServeCommand("vllm", ("--port", flag, "--task"))
    verdict = judge_flags(command, ACCEPTED, "vllm", "0.21.0")
    assert verdict.outcome == "refused"
    assert flag in verdict.refused and "not accepted by vllm 0.21.0" in verdict.reason
    assert verdict.refused.count("--task") == 1  # each named once


def test_a_removed_flag_is_named_as_the_issue_says() -> None:
    verdict = judge_flags(ServeCommand("vllm", ("--task",)), ACCEPTED, "vllm", "0.21.0")
    assert verdict.reason.startswith("`--task` is not accepted by vllm 0.21.0")


def test_a_config_file_is_said_as_not_looked_into() -> None:
    verdict = judge_flags(ServeCommand("vllm", ("--config", "--port")), ACCEPTED, "vllm", "0.21.0")
    assert verdict.outcome == "accepted" and "--config file are not checked" in verdict.reason


def test_the_help_section_between_the_marks() -> None:
    out = f"x\n{HELP_BEGIN}\n  --port PORT   Port.\n{HELP_END}\ny\n"
    assert help_section(out) == (["  --port PORT   Port."], None)
    failed = f"{HELP_BEGIN}\n{HELP_FAILED} exit 124: \n"
    assert help_section(failed) == ([], "exit 124:")
    # Cut off before its end (the script was killed): no section at all.
    assert help_section(f"{HELP_BEGIN}\n  --port PORT\n") is None
    assert help_section("nothing\n") is None


def test_nothing_garbage_and_an_endless_line_are_no_command_and_no_options() -> None:
    assert parse_exec_start("") is None
    assert parse_exec_start("\x00\xff{ path= ; argv[]= ; }") is None
    assert parse_exec_start("ExecStart=" + "x" * 16384) is None  # a line the transport cut
    # Help that is noise, or one endless line, lists nothing: judged unchecked, not passed.
    noise = ["", "\x1b[31m  ", "Traceback (most recent call last):", "  -" + "a" * 16384]
    options = parse_help_options(noise)
    verdict = judge_flags(ServeCommand("vllm", ("--task",)), options, "vllm", "0.21.0")
    assert verdict.outcome == "unchecked"


# ---- the real helps of vLLM 0.33.0 and 0.10.2, and what their real parsers did --------
# tests/samples/SOURCES.md: serve_help_all_0.33.0.txt is `vllm serve --help=all` of the
# PyPI vllm 0.33.0 (grouped, `--optimization-level`, no `-O`); serve_help_0.10.2.txt is
# 0.10.2's plain `--help` (`--compilation-config ..., -O ...`, `--task`, `{...}` choices);
# serve_parse_*.txt say what each release's own FlexibleArgumentParser did with a command
# line: "parsed", or argparse's exit 2 and its error.

HELP_0_33 = parse_help(sample("vllm_help/serve_help_all_0.33.0.txt"))
HELP_0_10 = parse_help(sample("vllm_help/serve_help_0.10.2.txt"))
HELPS = {"0.33.0": HELP_0_33, "0.10.2": HELP_0_10}


def judged(words: tuple[str, ...], version: str) -> FlagVerdict:
    return judge_flags(ServeCommand("vllm", words), HELPS[version], "vllm", version)


def parser_cases() -> list[tuple[str, tuple[str, ...], str]]:
    cases = []
    for version in HELPS:
        for line in sample(f"vllm_help/serve_parse_{version}.txt"):
            argv, _, real = line.partition(" => ")
            cases.append((version, tuple(argv.split()[2:]), real))
    return cases


# Where the judgement and the parser differ, and why (each on purpose):
# - 0.33.0 takes `-O.mode=3` as the level ".mode=3", which no OptimizationLevel is: the
#   engine fails after the stop (0.11-0.12 read it as `-O`'s JSON keys: unknown there).
# - A value vLLM lists as `['a', 'b']` (its parser takes any string; the engine decides,
#   after the start) or `{...} or name registered in ...`: outside the list, unchecked.
# - 0.10.2 refuses `-Odecode` and `-O x` for their value, which its help says nothing of.
DIFFERENT = {
    ("0.33.0", "-O.mode=3"): "refused",
    ("0.33.0", "-O.level=3"): "refused",
    ("0.33.0", "--tokenizer-mode slow"): "unchecked",
    ("0.33.0", "--kv-cache-dtype fp9"): "unchecked",
    ("0.33.0", "--tool-call-parser bogus"): "unchecked",
    ("0.10.2", "--tool-call-parser bogus"): "unchecked",
    ("0.10.2", "-Odecode"): "accepted",
    ("0.10.2", "-O x"): "accepted",
}


@pytest.mark.parametrize(("version", "words", "real"), parser_cases())
def test_the_judgement_is_what_the_real_parser_did(
    version: str, words: tuple[str, ...], real: str
) -> None:
    verdict = judged(("/models/m", *words), version)
    expected = "accepted" if real == "parsed" else "refused"
    assert verdict.outcome == DIFFERENT.get((version, " ".join(words)), expected), (
        real,
        verdict,
    )


def test_minus_o3_is_the_optimization_level_of_current_vllm() -> None:
    # Current vLLM's help lists `--optimization-level` and no `-O`: its parser rewrites
    # -O3, -O 3 and -O=3 before argparse sees them.
    assert "-O" not in HELP_0_33.options and "--optimization-level" in HELP_0_33.options
    for words in (("-O3",), ("-O", "3"), ("-O=3",), ("-O0", "--port", "8000")):
        assert judged(words, "0.33.0").outcome == "accepted", words
    # A lone -O before anything but a level stays -O, which that parser does not know.
    verdict = judged(("-O", "x"), "0.33.0")
    assert verdict.outcome == "refused" and verdict.refused == ("-O",)


def test_minus_o_the_old_way_keeps_working() -> None:
    # 0.10.2: `--compilation-config COMPILATION_CONFIG, -O COMPILATION_CONFIG`.
    assert "-O" in HELP_0_10.options and "--optimization-level" not in HELP_0_10.options
    for words in (("-O3",), ("-O", "3"), ("-O=3",), ("-O.level=3",)):
        assert judged(words, "0.10.2").outcome == "accepted", words
    assert judged(("--optimization-level", "3"), "0.10.2").outcome == "refused"


def test_the_current_help_lists_closed_and_open_choices() -> None:
    dtype = HELP_0_33.choices["--dtype"]
    assert dtype.closed and dtype.values == (
        "auto",
        "bfloat16",
        "float",
        "float16",
        "float32",
        "half",
    )
    # vLLM's `['a', 'b']`: the values it knows, any other string passes its parser.
    mode = HELP_0_33.choices["--tokenizer-mode"]
    assert not mode.closed and "hf" in mode.values and "slow" not in mode.values
    # `{...} or name registered in --tool-parser-plugin` is no closed set either.
    assert not HELP_0_33.choices["--tool-call-parser"].closed
    traces = HELP_0_33.choices["--collect-detailed-traces"]
    assert traces.closed and traces.many
    # An option whose help lists no values has none here: its value is not judged.
    assert "--quantization" not in HELP_0_33.choices and "-q" in HELP_0_33.options
    assert HELP_0_10.choices["--tokenizer-mode"].values == ("auto", "custom", "mistral", "slow")


def test_a_removed_choice_is_refused_naming_it() -> None:
    # A unit written for 0.33.0 (`--tokenizer-mode hf`) moved to 0.10.2, whose argparse
    # refuses hf ("invalid choice"): when the server starts, after the stop.
    verdict = judged(("--tokenizer-mode", "hf", "--dtype=bfloat16"), "0.10.2")
    assert verdict.outcome == "refused"
    assert verdict.reason.startswith(
        "`--tokenizer-mode hf` (it takes auto, custom, mistral, slow) is not accepted by "
        "vllm 0.10.2 (the unit's ExecStart passes it; change the unit first)"
    )
    assert verdict.refused == ("--tokenizer-mode hf",)
    assert judged(("--prefix-caching-hash-algo=xxhash",), "0.10.2").refused == (
        "--prefix-caching-hash-algo xxhash",
    )


@pytest.mark.parametrize(
    "words",
    [
        ("--dtype=bfloat16",),
        ("--dtype", "bfloat16", "--quantization", "fp8"),  # fp8: it lists no choices there
        ("--max-lora-rank", "08"),  # argparse compares after the type: 8
        ("--tokenizer-mod", "hf"),  # a prefix of the option, a listed value
        ("--collect-detailed-traces", "worker", "model"),
        ("--safetensors-load-strategy", "None"),
    ],
)
def test_a_good_but_unusual_value_passes(words: tuple[str, ...]) -> None:
    verdict = judged(words, "0.33.0")
    assert verdict.outcome == "accepted", verdict
    assert "values it lists no choices for are not checked" in verdict.reason


def test_a_value_outside_an_open_list_is_unchecked_never_accepted() -> None:
    # `slow` left vLLM's tokenizer modes; 0.33.0's parser still takes it (its engine then
    # knows no such tokenizer) and a plugin could register one: not known here.
    verdict = judged(("--tokenizer-mode", "slow"), "0.33.0")
    assert verdict.outcome == "unchecked"
    assert verdict.reason.startswith(
        "`--tokenizer-mode slow`: vllm 0.33.0 lists alpamayo2_super, auto, cohere, "
    )
    assert "takes other values only where something registers them" in verdict.reason
    note, warning = step_note(verdict)
    assert warning is not None and note.startswith("the unit's flags were not checked: ")


def test_a_prefix_of_a_choice_is_no_choice() -> None:
    # argparse matches choices exactly (serve_parse: `--dtype bfloat` is an invalid choice).
    assert judged(("--dtype", "bfloat"), "0.33.0").refused == ("--dtype bfloat",)
    assert judged(("--dtype", "BFLOAT16"), "0.33.0").outcome == "refused"


def test_help_all_of_0_10_lists_nothing_so_the_script_asks_help(tmp_path: Path) -> None:
    # vLLM 0.10.2 exits 0 on --help=all with the options whose name holds "all", none
    # indented (serve_help_all_0.10.2.txt): the prefetch's help part then runs --help. It
    # runs here as the host runs it, /bin/sh, against a vllm that prints the real outputs.
    assert parse_help_options(sample("vllm_help/serve_help_all_0.10.2.txt")) == frozenset()
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    vllm = venv / "bin" / "vllm"
    vllm.write_text(
        "#!/bin/sh\n"
        f'if [ "$2" = --help=all ]; then cat {SAMPLES}/vllm_help/serve_help_all_0.10.2.txt; '
        f"else cat {SAMPLES}/vllm_help/serve_help_0.10.2.txt; fi\n"
    )
    vllm.chmod(0o755)
    script = "hm=serve; gt=30; " + serve_help(str(venv))
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    section = help_section(out.stdout)
    assert section is not None and section[1] is None
    help_ = parse_help(section[0])
    assert help_.options == HELP_0_10.options and "-O" in help_.options
    verdict = judge_flags(
        ServeCommand("vllm", ("-O3", "--task", "generate")), help_, "vllm", "0.10.2"
    )
    assert verdict.outcome == "accepted"
