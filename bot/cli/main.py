"""`python -m bot ...`: the engine from a terminal.

Library errors become one clear line on stderr and a documented exit code;
a traceback means a bug.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TextIO, assert_never

from bot.audit.records import RunRecord
from bot.audit.view import run_view, runs_json, runs_table
from bot.cli import audit_export, operator, scheduled, setup_commands
from bot.cli.demo_faults import DEMO_FAULTS
from bot.cli.leftovers import TerminalGate, ask_terminal
from bot.cli.migrate import migrate
from bot.cli.terminal import TerminalSink, say, visible
from bot.core import remote
from bot.core.commands import GLOBAL_OPTIONS, Arg, Front, Kind, commands_of
from bot.core.gpu import render_table
from bot.core.health_types import Level
from bot.core.plan import STEP_TITLES, Plan
from bot.core.redact import Redactor
from bot.core.startup import history_line
from bot.core.status import Action, RunStatus
from bot.engine.deep_check import deep_check, deep_text
from bot.engine.gpu_health import health_lines
from bot.engine.host_runs import describe_host_plan, plan_of_words
from bot.engine.operations import Busy, Operator, Requested
from bot.engine.preview import HostPreview, preview_lines, record_previews
from bot.engine.recovery import Interrupted, expired_message
from bot.engine.request_reads import read_at_request
from bot.engine.run_results import Refused
from bot.engine.runtime import Runtime, open_runtime
from bot.engine.schedule import AT_ONCE, Timing
from bot.engine.status_query import query, router_line
from bot.errors import ChatOpsError, ConfigError, InputError, NotConfirmed
from bot.hosts.fleet import HostGpus, fleet_gpus, health_details, render_fleet, resolve_targets
from bot.hosts.fleet_states import host_table, is_big, summary_text
from bot.hosts.nvml import probe_local
from bot.logging_setup import setup_logging
from bot.settings import Settings, load_settings
from bot.settings.database import SCHEMES as DB_SCHEMES
from bot.settings.database import url_secrets

EXIT_CODES = {
    RunStatus.SUCCEEDED: 0,
    RunStatus.FAILED: 1,
    RunStatus.ROLLED_BACK: 3,
    RunStatus.ABORTED: 4,
    RunStatus.CANCELLED: 5,
    RunStatus.INTERRUPTED: 1,
}
EXIT_USAGE = 2
# The operator answered no at a prompt: nothing was done, as for a cancel.
EXIT_DECLINED = EXIT_CODES[RunStatus.CANCELLED]


def cli_user() -> str:
    return f"cli:{getpass.getuser()}@{socket.gethostname()}"


# What the table (bot.core.commands) cannot know: the demo's faults are named here.
_MORE_HELP = {("demo", "--fault"): ", ".join(DEMO_FAULTS)}


def _add(parser: argparse.ArgumentParser, command: str, arg: Arg, default: Any = None) -> None:
    """One argument of the table, as argparse takes it."""
    kw: dict[str, Any] = {}
    help_text = (arg.help or "") + _MORE_HELP.get((command, arg.name), "")
    if help_text:
        kw["help"] = help_text
    if arg.metavar is not None:
        kw["metavar"] = arg.metavar
    if arg.kind is Kind.FLAG:
        kw["action"] = "store_true"
    else:
        if arg.type is not str:
            kw["type"] = arg.type
        if arg.kind is Kind.REPEAT:
            kw["action"] = "append"
        if arg.kind is Kind.REST:
            kw["nargs"] = "*"
        if arg.positional and arg.optional:
            kw["nargs"] = "?"
        value = arg.default if default is None else default
        if value is not None:
            # argparse appends to a list default: never the table's own (a tuple).
            kw["default"] = list(value) if isinstance(value, tuple) else value
    parser.add_argument(*arg.names, **kw)


def build_parser() -> argparse.ArgumentParser:
    """The terminal's commands, built from the one command table (``bot.core.commands``)
    the Slack grammar is built from too."""
    p = argparse.ArgumentParser(
        prog="python -m bot",
        description="vllm-chatops: redeploy and inspect vLLM services on GPU hosts. "
        "With no command, runs the Slack bot.",
    )
    common = argparse.ArgumentParser(add_help=False)
    for option in GLOBAL_OPTIONS:
        # Accepted before or after the command; the subcommand's copy must not reset it.
        _add(p, "", option)
        _add(common, "", option, default=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command")
    for command in commands_of(Front.CLI):
        parser = sub.add_parser(command.name, parents=[common], help=command.help)
        for arg in command.args_of(Front.CLI):
            _add(parser, command.name, arg)
    return p


def _settings(args: argparse.Namespace) -> Settings:
    if args.db and str(args.db).startswith(DB_SCHEMES) and url_secrets(str(args.db)):
        # Every user of the machine reads a command line (ps), and the shell keeps it.
        raise ConfigError(
            "--db carries the database's password, which the command line shows to every "
            "user of this machine and the shell keeps in its history: give it in "
            "PGPASSWORD or ~/.pgpass (PGPASSFILE), or the whole URL in CHATOPS_DB"
        )
    overrides = {"CHATOPS_DB": str(args.db)} if args.db else {}
    return load_settings(args.config, **overrides)


def describe_plan(plan: Plan) -> str:
    if plan.action.host_wide:
        return describe_host_plan(plan)
    lines = [
        f"{plan.action} {plan.service} on {', '.join(plan.hosts)} "
        f"(unit {plan.unit}, {plan.spec}"
        + (
            f" from index {plan.index_name} ({remote.index_host(plan.index_url or '')})"
            if plan.index_name
            else ""
        )
        + ")"
        + (" [dry run]" if plan.dry_run else "")
    ]
    if len(plan.hosts) > 1:
        lines.append(
            f"in batches of {plan.batch_size}: " + " | ".join(", ".join(b) for b in plan.batches())
        )
    for i, s in enumerate(plan.steps, 1):
        lines.append(f"  {i}. {STEP_TITLES[s.step]}: {s.command}")
    return "\n".join(lines)


def _confirm(prompt: str, stdin: TextIO) -> bool:
    if not stdin.isatty():
        return False
    sys.stderr.write(prompt)
    sys.stderr.flush()
    return stdin.readline().strip().lower() in ("y", "yes")


async def _show_reads(
    rt: Runtime, plan: Plan, *, load: bool, out: TextIO
) -> tuple[HostPreview, ...]:
    """Print what the hosts say before anyone confirms; returns the package previews."""
    reads = await read_at_request(rt.settings, rt.pool, rt.audit, plan, load=load)
    if reads.load is not None:
        say(out, rt.redact(reads.load))
    if reads.targets:
        say(out, rt.redact("\n".join(["rollback (read now):", *reads.targets])))
    if reads.previews:
        say(
            out,
            rt.redact(
                "\n".join(["package changes (dry run now):", *preview_lines(reads.previews)])
            ),
        )
    if reads.health:
        say(out, rt.redact("\n".join(health_lines(reads.health))))
    return reads.previews


async def _request(
    rt: Runtime, plan: Plan, user: str, timing: Timing = AT_ONCE
) -> RunRecord | None:
    """The request, through the operations service: on a terminal the operator's own
    confirmation is the approval and is recorded as such; a dry run or status query is
    approved by the system, as in Slack. None when refused (said on stderr; the service
    recorded the request 'refused', with its refusals row)."""
    asked = await rt.operations.request(plan, by=Operator(user), timing=timing)
    match asked:
        case Requested(record=record):
            return record
        case Busy(reason=reason) | Refused(reason=reason):
            print(f"error: {visible(reason)}", file=sys.stderr)
            return None
        case _:
            assert_never(asked)


async def run_change(
    rt: Runtime,
    plan: Plan,
    *,
    yes: bool,
    user: str,
    out: TextIO = sys.stdout,
    kill_leftovers: bool = False,
    timing: Timing = AT_ONCE,
) -> int:
    """Plan, confirm, record, execute: the terminal's version of the Slack approval.
    With ``--at`` (``timing``) the confirmed run is recorded for later and this returns;
    ``scheduled --start-due`` starts it then."""
    say(out, rt.redact(describe_plan(plan)))

    async def told(item: Interrupted) -> None:
        # A dead process's run was holding the lock: recovered before ours is taken.
        say(out, rt.redact(f"recovered: {item.message}"))

    async def closed(run: RunRecord) -> None:
        # A request left awaiting approval past its window (no bot expired it) held it.
        say(out, rt.redact(f"expired: {expired_message(run)}"))

    asks = not (yes or plan.dry_run)
    if asks and not sys.stdin.isatty():
        # Nobody could confirm: refused before anything reads the host.
        raise InputError("not confirmed (use --yes when not on a terminal)")
    # What the operator confirms having seen, as approvers do on the card: the load the
    # stop would wait for (or --force interrupt; only when someone confirms), what the
    # redeploy would change besides vLLM (torch, CUDA wheels...), and the service's GPUs
    # where they are not all ok, read as the run's GPU check reads them.
    previews = await _show_reads(rt, plan, load=asks, out=out)
    rt.lifecycle.recovered.append(told)
    rt.lifecycle.expired.append(closed)
    if asks:
        if not _confirm("Proceed? [y/N] ", sys.stdin):
            raise NotConfirmed("not confirmed: nothing was done")  # on a terminal: a no
    record = await _request(rt, plan, user, timing)
    if record is None:
        return 1
    await record_previews(rt.audit, record.id, previews)
    if record.status == RunStatus.SCHEDULED:
        assert record.scheduled_at is not None
        say(
            out,
            f"scheduled: run #{record.id} starts {scheduled.starts(rt, record)}, if its "
            "maintenance window is still open then. `python -m bot scheduled "
            "--start-due` starts it when due (run it from a timer); `python -m bot "
            f"scheduled --cancel {record.id}` cancels it.",
        )
        return 0
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        # First Ctrl-C asks the engine to cancel at its next safe point (a reinstall
        # is never cut in half); a second one is the default hard stop.
        if rt.operations.request_cancel(record.id, user):
            sys.stderr.write("\ncancel requested: the run stops at its next safe point\n")
        loop.remove_signal_handler(signal.SIGINT)

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (NotImplementedError, RuntimeError):
        pass
    sink = TerminalSink(out, redact=rt.redact)
    try:
        gate = TerminalGate(
            rt,
            user,
            approve=kill_leftovers,
            ask=ask_terminal if sys.stdin.isatty() else None,
            out=out,
        )
        result = await rt.engine.execute(record.id, sink, gate=gate)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        sink.close()  # a line held back, when the run raised before its end
    return EXIT_CODES.get(result.status, 1)


async def _operator_command(rt: Runtime, args: argparse.Namespace) -> int:
    """``runs`` and ``recover``: the operator's view of owners and locks, and way out."""
    if args.command == "runs":
        if not 1 <= args.limit <= 10_000:
            raise InputError("--limit must be between 1 and 10000")
        return await operator.list_runs(rt, active=args.active, limit=args.limit, as_json=args.json)
    return await operator.recover_run(
        rt,
        args.run_id,
        force=args.force,
        yes=args.yes,
        user=cli_user(),
        confirm=(lambda prompt: _confirm(prompt, sys.stdin)) if sys.stdin.isatty() else None,
    )


# Runs the Slack bot. Injected by ``bot.__main__``: the terminal front end never imports
# the Slack one (each is a front end of the engine), and a CLI command never pays for
# importing slack_bolt.
Serve = Callable[[Settings], Awaitable[int]]


async def _no_slack(settings: Settings) -> int:
    raise ConfigError("this entry point cannot run the Slack bot; use `python -m bot`")


# The commands of the engine: a run (a change), or a read that is no run (status, rotation).
_RUNS = ("redeploy", "restart", "rollback", "status", "rotation", "drain", "undrain", "host")


async def _run_command(rt: Runtime, args: argparse.Namespace) -> int:
    timing = Timing(at=getattr(args, "at", None), now=getattr(args, "now", False))
    if args.command == "redeploy":
        plan = rt.engine.plan(
            Action.REDEPLOY,
            args.service,
            version=args.version,
            index=args.index,
            dry_run=args.dry_run,
            batch=args.batch,
            force=args.force,
        )
        return await run_change(
            rt,
            plan,
            yes=args.yes,
            user=cli_user(),
            kill_leftovers=args.kill_leftovers,
            timing=timing,
        )
    if args.command == "restart":
        plan = rt.engine.plan(Action.RESTART, args.service, batch=args.batch, force=args.force)
        return await run_change(
            rt,
            plan,
            yes=args.yes,
            user=cli_user(),
            kill_leftovers=args.kill_leftovers,
            timing=timing,
        )
    if args.command == "rollback":
        plan = rt.engine.plan(Action.ROLLBACK, args.service)
        return await run_change(rt, plan, yes=args.yes, user=cli_user(), timing=timing)
    if args.command == "status":
        # A read, not a run: nothing is recorded (bot.engine.status_query).
        plan = rt.engine.plan(Action.STATUS, args.service)
        answer = await query(rt.engine, plan)
        print(visible(rt.redact(answer.text)))
        print(visible(history_line(await rt.audit.start_history(args.service))))
        return 0 if answer.ok else 1
    if args.command == "rotation":
        plan = rt.engine.plan(Action.ROTATION, args.service)
        answer = await query(rt.engine, plan, tables=False, with_status=False)
        print(visible(rt.redact("\n".join([router_line(plan), answer.text]))))
        return 0 if answer.ok else 1
    if args.command == "host":
        return await run_change(
            rt,
            plan_of_words(rt.settings, args.operation, args.host, args.gpus, args.force),
            yes=args.yes,
            user=cli_user(),
            timing=timing,
        )
    if args.command in ("drain", "undrain"):
        action = Action.DRAIN if args.command == "drain" else Action.UNDRAIN
        plan = rt.engine.plan(action, args.service, host=args.host)
        return await run_change(rt, plan, yes=args.yes, user=cli_user())
    raise InputError(f"unknown command {args.command}")


# Commands that need no runtime: releases, sudoers and doctor do not open the audit
# database (doctor changes nothing anywhere); migrate opens it to change its schema.
_WITHOUT_RUNTIME: dict[str, Callable[[Settings, argparse.Namespace], Awaitable[int]]] = {
    "releases": lambda settings, args: setup_commands.releases(settings, args.service),
    "sudoers": setup_commands.print_sudoers,
    "doctor": lambda settings, args: setup_commands.doctor(
        settings, args.target, as_json=args.json, config=args.config
    ),
    "migrate": lambda settings, args: migrate(settings),
}


async def _amain(args: argparse.Namespace, serve: Serve) -> int:
    if args.command == "demo":
        if args.config is not None or args.db is not None:
            # The demo makes its own host, config and audit database (in --dir): taking
            # these and ignoring them would leave the operator looking in the wrong place.
            raise InputError(
                "demo makes its own configuration and audit database (in --dir, default "
                "./demo-run): it takes no --config or --db"
            )
        from bot.cli.demo import run_demo

        return await run_demo(faults=args.fault, keep_dir=args.dir, fast=args.fast)
    if args.command == "gpus" and args.local:
        snap = await asyncio.to_thread(probe_local, socket.gethostname())
        print(visible(render_table(snap)))
        return 0
    settings = _settings(args)
    # Logs pass through the same redaction as Slack and the audit log. The bot logs its
    # progress; a terminal command shows only warnings (its output is the progress).
    serving = args.command in (None, "serve")
    setup_logging(
        Redactor.for_settings(settings), level=logging.INFO if serving else logging.WARNING
    )
    if serving:
        return await serve(settings)
    if (without := _WITHOUT_RUNTIME.get(args.command)) is not None:
        return await without(settings, args)
    async with open_runtime(settings) as rt:
        if args.command in _RUNS:
            return await _run_command(rt, args)
        if args.command == "gpus" and args.deep:
            reports = await deep_check(
                settings, rt.pool, rt.audit, resolve_targets(settings, args.target), args.timeout
            )
            print(visible(rt.redact(deep_text(reports))))
            return 1 if any(r.level == Level.CRITICAL for r in reports) else 0
        if args.command == "gpus":
            hosts = resolve_targets(settings, args.target)
            results = await fleet_gpus(settings, rt.pool, hosts, args.timeout)
            print(visible(gpus_text(results, health=args.health, summary=args.summary)))
            return 0 if all(r.snapshot is not None for r in results) else 1
        if args.command == "audit":
            return await _audit(rt, args)
        if args.command in ("runs", "recover"):
            return await _operator_command(rt, args)
        if args.command == "scheduled":
            return await _scheduled(rt, args)
    raise InputError(f"unknown command {args.command}")


async def _scheduled(rt: Runtime, args: argparse.Namespace) -> int:
    if args.start_due and args.cancel is not None:
        raise InputError("--start-due and --cancel: one at a time")
    if args.start_due:
        return await scheduled.start_due(rt, user=cli_user())
    if args.cancel is not None:
        return await scheduled.cancel(rt, args.cancel, user=cli_user())
    return await scheduled.list_scheduled(rt, as_json=args.json)


def gpus_text(results: list[HostGpus], *, health: bool, summary: bool) -> str:
    """``gpus``: the health details; or the summary alone (``--summary``); a big fleet's
    summary and a line per host (its 8,000 per-GPU rows would scroll the summary away);
    else every host's per-GPU table."""
    if health:
        return health_details(results)
    if summary:
        return summary_text(results)
    if is_big(results):
        return f"{summary_text(results)}\n\n{host_table(results)}"
    return render_fleet(results)


async def _export(rt: Runtime, args: argparse.Namespace) -> int:
    """``audit --format jsonl``: every run streamed, a JSON object a line (README: Audit
    export); ``--follow`` goes on until Ctrl-C or the reader goes away."""
    if args.format != "jsonl":
        raise InputError(f"--format {args.format!r}: the one format is jsonl")
    if args.run is not None:
        raise InputError("--format jsonl streams runs: it takes no --run (use --since)")
    flt = audit_export.export_filter(
        service=args.service, since=args.since, until=args.until, follow=args.follow
    )
    redact = Redactor.for_settings(rt.settings)
    try:
        await audit_export.export_jsonl(
            rt.audit,
            sys.stdout.write,
            flt,
            redact=redact,
            follow=args.follow,
            flush=sys.stdout.flush,
        )
    except BrokenPipeError:
        # The reader (head, a shipper restarting) went away: nothing is wrong here.
        return 0
    return 0


async def _audit(rt: Runtime, args: argparse.Namespace) -> int:
    """``audit``: the newest runs (with what each install changed, in JSON), or one run
    with its steps and its package changes (``--run N``)."""
    if args.format is not None:
        return await _export(rt, args)
    if args.since or args.until or args.follow:
        raise InputError("--since, --until and --follow go with --format jsonl")
    if not 1 <= args.limit <= 10_000:
        raise InputError("--limit must be between 1 and 10000")
    if args.run is not None:
        record = await rt.audit.get_run(args.run)
        switches = (await rt.audit.release_switches([record.id])).get(record.id, [])
        print(
            visible(
                run_view(
                    record,
                    await rt.audit.steps(record.id),
                    await rt.audit.environments(record.id),
                    switches,
                )
            )
        )
        return 0
    records = await rt.audit.list_runs(service=args.service, limit=args.limit)
    ids = [r.id for r in records]
    if not args.json:
        print(visible(runs_table(records)))
        return 0
    print(
        visible(
            runs_json(
                records,
                await rt.audit.packages_changed(ids),
                await rt.audit.restorations(ids),
                await rt.audit.host_outcomes(ids),
                await rt.audit.rotations(ids),
                await rt.audit.release_switches(ids),
            )
        )
    )
    return 0


def main(argv: Sequence[str] | None = None, *, serve: Serve = _no_slack) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_amain(args, serve))
    except ConfigError as e:
        print(f"error: {visible(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except InputError as e:
        print(f"error: {visible(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except NotConfirmed as e:
        print(visible(str(e)), file=sys.stderr)
        return EXIT_DECLINED
    except ChatOpsError as e:
        print(f"error: {visible(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
