"""`python -m bot ...` as an operator runs it: a subprocess, a TOML file, a real DB."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from bot.cli.demo_faults import DEMO_FAULTS
from bot.core.doctor_config import judge_config
from bot.sim.kit import SERVICE, SimKit
from bot.sim.state import DEFAULT_VERSION, Faults
from tests.support.cli import cli, cli_on_terminal, write_toml


def setup(kit: SimKit, tmp_path: Path) -> dict[str, str]:
    config = write_toml(tmp_path / "chatops.toml", kit.settings_fragment())
    return {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db")}


async def test_redeploy_then_audit_json(sim_host: SimKit, tmp_path: Path) -> None:
    env = setup(sim_host, tmp_path)
    code, out, err = await cli(
        "redeploy",
        SERVICE,
        "--version",
        "0.31.0",
        "--index",
        "nightly",
        "--yes",
        cwd=tmp_path,
        env=env,
    )
    assert code == 0, err + out
    assert "Verify GPU memory drained" in out and "SUCCEEDED" in out
    assert sim_host.installed_version == "0.31.0"

    code, out, err = await cli("audit", "--json", cwd=tmp_path, env=env)
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 1
    row = rows[0]
    for key in (
        "id",
        "service",
        "action",
        "requested_by",
        "approved_by",
        "status",
        "version_before",
        "version_after",
        "started_at",
        "finished_at",
    ):
        assert key in row
    assert (row["service"], row["action"], row["status"]) == (SERVICE, "redeploy", "succeeded")
    assert row["requested_by"].startswith("cli:") and row["approved_by"] == [row["requested_by"]]
    assert (row["version_before"], row["version_after"]) == (DEFAULT_VERSION, "0.31.0")
    # How the run left the service, as a value (issue 18), for the run and for its host.
    assert row["service_state"] == "up"
    assert row["host_outcomes"] == [
        {"host": "gpu-node-1", "status": "succeeded", "service_state": "up"}
    ]
    # What the install really changed, read back from the host's own uv output: torch
    # moved with vLLM (the simulated 0.31.0 release pulls in the CUDA 13 build).
    changed = {c["name"]: (c["before"], c["after"]) for c in row["packages_changed"]}
    assert changed["torch"] == ("2.12.1+cu129", "2.13.0")
    assert changed["vllm"] == (DEFAULT_VERSION, "0.31.0")
    assert sim_host.environment()["torch"] == "2.13.0"

    code, out, err = await cli("audit", "--run", str(row["id"]), cwd=tmp_path, env=env)
    assert code == 0, err
    made = out.split("Package changes the install made:\n", 1)[1].splitlines()
    assert "    ! torch 2.12.1+cu129 → 2.13.0" in made, out

    code, out, _ = await cli("audit", "--service", SERVICE, cwd=tmp_path, env=env)
    assert code == 0 and "succeeded" in out and "redeploy" in out


async def test_a_dry_run_ends_saying_nothing_changed(sim_host: SimKit, tmp_path: Path) -> None:
    code, out, err = await cli(
        "redeploy",
        SERVICE,
        "--version",
        "0.31.0",
        "--index",
        "nightly",
        "--dry-run",
        cwd=tmp_path,
        env=setup(sim_host, tmp_path),
    )
    assert code == 0, err + out
    last = out.rstrip().splitlines()[-1]
    # Not "(version <before> -> None)": a dry run has no version after, it changed nothing.
    assert last.startswith("run #1 SUCCEEDED (dry run: nothing changed): "), last
    assert "-> None" not in out
    assert sim_host.changes() == ["dry-run"] and sim_host.installed_version == DEFAULT_VERSION


async def test_redeploy_without_yes_off_a_terminal_is_refused(
    sim_host: SimKit, tmp_path: Path
) -> None:
    env = setup(sim_host, tmp_path)
    code, _, err = await cli("redeploy", SERVICE, cwd=tmp_path, env=env)
    assert code == 2 and "not confirmed (use --yes when not on a terminal)" in err
    assert sim_host.calls() == []


async def test_a_no_on_a_terminal_is_just_not_confirmed(sim_host: SimKit, tmp_path: Path) -> None:
    env = setup(sim_host, tmp_path)
    code, _, err = await cli_on_terminal("restart", SERVICE, answer="n\n", cwd=tmp_path, env=env)
    # The operator was asked and said no: nothing was done, which is the cancel's exit
    # code (5), and no hint about --yes, which was not the problem.
    assert code == 5 and "Proceed? [y/N]" in err, err
    assert err.endswith("not confirmed: nothing was done\n"), err
    assert sim_host.changes() == []


async def test_the_operator_is_shown_the_load_before_confirming_and_yes_reads_none(
    sim_host: SimKit, tmp_path: Path
) -> None:
    env = setup(sim_host, tmp_path)
    # Requests running on the server now, and still when the CLI reads the load: the
    # default 3 s window could end during a slow interpreter start on a loaded machine.
    sim_host.update_config(busy_drain_s=600.0)
    sim_host.set_faults(busy=True)
    code, out, err = await cli_on_terminal(
        "redeploy",
        SERVICE,
        "--version",
        "0.31.0",
        "--index",
        "nightly",
        answer="n\n",
        cwd=tmp_path,
        env=env,
    )
    assert code == 5 and "Proceed? [y/N]" in err, err
    # What the stop would wait for, then the package change: both before the question.
    load = out.index("Load now: ")
    assert "running" in out[load:].splitlines()[0], out
    assert load < out.index("package changes (dry run now):"), out
    # With --yes nobody confirms: no load line (the run's own drain reads it later).
    code, out, err = await cli(
        "redeploy",
        SERVICE,
        "--version",
        "0.31.0",
        "--index",
        "nightly",
        "--dry-run",
        "--yes",
        cwd=tmp_path,
        env=env,
    )
    assert code == 0, err + out
    assert "Load now: " not in out


async def test_rollback_exit_code(sim_host: SimKit, tmp_path: Path) -> None:
    sim_host.set_faults(uv_fails=True)
    code, out, _ = await cli(
        "redeploy", SERVICE, "--yes", cwd=tmp_path, env=setup(sim_host, tmp_path)
    )
    assert code == 3 and "ROLLED_BACK" in out


async def test_a_rolled_back_run_says_its_package_changes_were_undone(
    sim_host: SimKit, tmp_path: Path
) -> None:
    before = sim_host.environment()
    sim_host.set_faults(uv_fails_midway=True)  # torch moves, then the install fails
    env = setup(sim_host, tmp_path)
    code, out, _ = await cli(
        "redeploy",
        SERVICE,
        "--version",
        "0.31.0",
        "--index",
        "nightly",
        "--yes",
        cwd=tmp_path,
        env=env,
    )
    assert code == 3 and "ROLLED_BACK" in out
    assert sim_host.environment() == before

    code, out, err = await cli("audit", "--json", cwd=tmp_path, env=env)
    assert code == 0, err
    [row] = json.loads(out)
    # What the failed install did is kept, and said to be undone, not what the host has.
    assert {"name": "torch", "before": "2.12.1+cu129", "after": "2.13.0"} in row["packages_changed"]
    assert row["environment_after_rollback"] == "equals_snapshot"
    # Rolled back: the previous version serves again (issue 18's service state).
    assert row["service_state"] == "up" and row["host_outcomes"][0]["service_state"] == "up"

    code, out, err = await cli("audit", "--run", str(row["id"]), cwd=tmp_path, env=env)
    assert code == 0, err
    assert (
        "Package changes the install made (undone: the rollback restored the snapshot):"
    ) in out, out


async def test_a_critical_gpu_is_printed_before_the_run_and_the_run_refused(
    sim_host: SimKit, tmp_path: Path
) -> None:
    sim_host.set_faults(pending_remap=True)
    code, out, err = await cli(
        "restart", SERVICE, "--yes", cwd=tmp_path, env=setup(sim_host, tmp_path)
    )
    shown = "GPU health: gpu-node-1: GPU 3 critical: a row remap is pending"
    assert shown in out, err + out
    assert "The preflight will refuse the run on gpu-node-1" in out
    # Read before the run is recorded, as the card reads it before anyone approves.
    assert out.index(shown) < out.index("run #1: restart")
    assert code != 0 and "preflight refused; service untouched" in out
    assert "stop" not in sim_host.changes()


async def test_status_shows_the_model_the_load_and_the_last_start(
    sim_host: SimKit, tmp_path: Path
) -> None:
    env = setup(sim_host, tmp_path)
    code, out, err = await cli("restart", SERVICE, "--yes", cwd=tmp_path, env=env)
    assert code == 0, err + out
    # Requests in flight, finishing over 10 minutes: the counts hold while status reads.
    sim_host.update_config(busy_running=4, busy_waiting=2, busy_drain_s=600.0)
    sim_host.set_faults(busy=True)
    code, out, err = await cli("status", SERVICE, cwd=tmp_path, env=env)
    assert code == 0, err + out
    assert "serving kimi-k2.5; 4 running, 2 waiting requests, KV cache" in out, out
    # The restart's health gate, from the audit log.
    assert re.search(
        r"^last start: ready \d+s after systemctl start \(median of the last 1: "
        r"\d+s\)$",
        out,
        re.M,
    ), out
    # A read is no run: the audit log holds the restart alone, however often it is asked.
    code, out, err = await cli("audit", "--json", cwd=tmp_path, env=env)
    assert [r["action"] for r in json.loads(out)] == ["restart"], out


async def test_bad_input_is_one_clear_line(sim_host: SimKit, tmp_path: Path) -> None:
    env = setup(sim_host, tmp_path)
    code, _, err = await cli(
        "redeploy", SERVICE, "--version", "1.0; rm -rf /", "--yes", cwd=tmp_path, env=env
    )
    assert code == 2 and "not a PEP 440 version" in err and "Traceback" not in err
    code, _, err = await cli("redeploy", "nope", "--yes", cwd=tmp_path, env=env)
    assert code == 2 and f"configured services: {SERVICE}" in err
    code, _, err = await cli("redeploy", SERVICE, "--index", "pypi", "--yes", cwd=tmp_path, env=env)
    assert code == 2 and "configured: cu129, nightly" in err
    assert sim_host.calls() == []


async def test_bad_config_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[hosts.h1]\naddress = "10.0.0.1"\n[services.s]\nhosts = ["h1"]\n'
        'unit = "x"\npython = "relative/python"\n'
    )
    code, _, err = await cli("audit", "--config", str(bad), cwd=tmp_path)
    assert code == 2
    assert "hosts.h1: known_hosts is required" in err
    assert "services.s.python: must be an absolute path" in err


async def test_gpus_across_hosts_marks_broken_ones(sim_host: SimKit, tmp_path: Path) -> None:
    env = setup(sim_host, tmp_path)
    code, out, _ = await cli("gpus", cwd=tmp_path, env=env)
    assert code == 0 and "1/1 hosts ok" in out and "VLLM::Worker_TP0" in out
    sim_host.set_faults(no_driver=True)
    code, out, _ = await cli("gpus", SERVICE, cwd=tmp_path, env=env)
    assert code == 1 and "UNAVAILABLE" in out and "driver" in out


async def test_demo_runs_a_full_redeploy(tmp_path: Path) -> None:
    code, out, err = await cli("demo", "--fast", "--dir", str(tmp_path / "demo"), cwd=tmp_path)
    assert code == 0, err + out
    assert "run #1 SUCCEEDED" in out
    assert "demo:alice" in out and "demo:bob" in out
    assert (tmp_path / "demo" / "chatops.db").exists()


@pytest.mark.parametrize("option", [("--config", "chatops.toml"), ("--db", "elsewhere.db")])
async def test_demo_refuses_a_config_or_database_it_would_not_use(
    tmp_path: Path, option: tuple[str, str]
) -> None:
    # The demo makes its own host, config and database: an option it ignored would leave
    # the operator looking for the run in a database it never wrote.
    code, out, err = await cli("demo", "--fast", *option, cwd=tmp_path)
    assert code == 2 and "takes no --config or --db" in err, err + out
    assert not (tmp_path / "demo-run").exists() and not (tmp_path / "elsewhere.db").exists()


def test_the_demo_offers_every_fault_of_the_simulator_but_a_test_knob() -> None:
    # Named apart from the simulator (see bot.cli.demo_faults): a new fault switch must be
    # added there too, or left out here on purpose.
    # The host-maintenance faults act on a reboot or a GPU reset, which the demo (a
    # redeploy) never does: offering them would show nothing.
    knobs = ("uv_stalls", "reboot_hangs", "reboot_slow", "reset_refused")
    assert DEMO_FAULTS == tuple(f.name for f in fields(Faults) if f.name not in knobs)


async def test_a_command_other_than_demo_does_not_import_the_simulator(tmp_path: Path) -> None:
    # Every start of the command line would pay for it (the demo's help names the faults).
    code, out, err = await cli("--help", cwd=tmp_path, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert code == 0 and "demo" in out, err
    imported = [
        line.rsplit("|", 1)[-1].strip()
        for line in err.splitlines()
        if line.startswith("import time:")
    ]
    assert "bot.cli.main" in imported, err  # what follows would pass on any output
    assert [m for m in imported if m.startswith("bot.sim")] == []


async def test_demo_help_lists_the_faults_and_an_api_fault_is_the_new_builds(
    tmp_path: Path,
) -> None:
    code, out, err = await cli("demo", "--help", cwd=tmp_path)
    assert code == 0, err
    listed = " ".join(out.split())  # argparse wraps the help
    assert all(
        f in listed
        for f in (
            "wrong_model",
            "smoke_fail",
            "smoke_empty",
            "busy",
            "oom_at_start",
            "d_state_worker",
        )
    ), out
    # The new build serves another model; the rollback to the booted build serves the
    # right one again: the story ends rolled back on a serving unit, not DOWN.
    code, out, err = await cli(
        "demo", "--fast", "--fault", "wrong_model", "--dir", str(tmp_path / "demo"), cwd=tmp_path
    )
    assert code == 0, err + out
    assert "lists Kimi-K2-Instruct, not kimi-k2.5" in out
    assert "run #1 ROLLED_BACK" in out and "DOWN" not in out and "NOT READY" not in out
    assert out.rstrip().endswith(f"host now: unit active, vllm {DEFAULT_VERSION}"), out


async def test_doctor_with_no_configuration_fails_and_says_how_to_make_one(
    tmp_path: Path,
) -> None:
    # A first run from the wrong directory: no ./chatops.toml, so nothing to check. It
    # used to say "all checks passed".
    code, out, err = await cli("doctor", cwd=tmp_path)
    assert code == 1, err + out
    assert "chatops.toml does not exist" in out and "deploy/chatops.example.toml" in out
    assert "all checks passed" not in out
    # A file that names no host checks nothing either.
    config = write_toml(tmp_path / "empty.toml", {})
    code, out, err = await cli("doctor", "--config", str(config), "--json", cwd=tmp_path)
    assert code == 1, err + out
    [row] = [r for r in json.loads(out) if r["host"] == "(configuration)"]
    assert row["result"] == "fail" and row["detail"] == f"{config} configures no host"
    assert not (tmp_path / "chatops.db").exists()


async def test_doctor_names_the_configuration_it_read(sim_host: SimKit, tmp_path: Path) -> None:
    env = setup(sim_host, tmp_path)
    _, out, err = await cli("doctor", "--json", cwd=tmp_path, env=env)
    assert out, err
    [row] = [r for r in json.loads(out) if r["host"] == "(configuration)"]
    assert row["result"] == "ok" and row["detail"].endswith("1 host(s), 1 service(s)"), row


@pytest.mark.parametrize(
    ("exists", "hosts", "services", "result"),
    [
        (False, 0, 0, "fail"),
        (True, 0, 0, "fail"),
        # Hosts but no service: gpus and host maintenance work, nothing to redeploy.
        (True, 2, 0, "warn"),
        (True, 2, 1, "ok"),
        # Settings that came from elsewhere than the file still count.
        (False, 1, 1, "ok"),
    ],
)
def test_the_configuration_row_judges_what_was_configured(
    exists: bool, hosts: int, services: int, result: str
) -> None:
    check = judge_config("chatops.toml", exists, hosts, services)
    assert str(check.outcome) == result, check
    assert ("deploy/chatops.example.toml" in check.fix) == (result != "ok")
