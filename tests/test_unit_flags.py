"""Issue 20, item 2: the unit's flags against the new vLLM's own help, on real captures
(tests/samples/SOURCES.md: vllm#10017, achatbot#191, vllm-omni#744, systemd#16051)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.remote import parse_unit_show
from bot.core.unit_flags import (
    HELP_BEGIN,
    HELP_END,
    HELP_FAILED,
    ServeCommand,
    help_section,
    judge_flags,
    parse_exec_start,
    parse_help_options,
    serve_command,
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
    assert command == ServeCommand(
        "/opt/venvs/vllm/bin/vllm",
        ("--tensor-parallel-size", "--port=8000", "--override-generation-config", "-O3"),
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
