"""`python -m bot demo`: a full redeploy against an embedded simulated GPU host.

No Slack, no GPU, no root: the simulated host is an asyncssh server on 127.0.0.1
with a throwaway host key, and the engine talks to it exactly as it would to a
real host (strict host-key checking included).  The audit database is real.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from bot.audit.view import runs_table
from bot.cli.demo_faults import DEMO_FAULTS
from bot.cli.leftovers import TerminalGate
from bot.cli.terminal import TerminalSink, say
from bot.core.status import Action, RunStatus, Source
from bot.engine.operations import Operator, Requested
from bot.engine.runtime import open_runtime
from bot.errors import ChatOpsError, InputError
from bot.settings import Settings
from bot.sim.kit import READY_SETTINGS, SERVICE, SimKit, fast_config
from bot.sim.state import REMOVED_VALUE, UNIT_FLAGS, HostConfig

FAULTS = DEMO_FAULTS
DEMO_VERSION = "0.31.0"
REQUESTER, APPROVER = "demo:alice", "demo:bob"
# Real-looking but short timings: the whole demo takes about 20 seconds.
DEMO_TIMINGS: dict[str, Any] = {
    "release_delay_s": 3.0,
    "load_delay_s": 5.0,
    "install_duration_s": 4.0,
    "stop_delay_s": 0.5,
    "fail_delay_s": 1.0,
    # Wheels not in uv's cache arrive at 1 GiB/s, as from a nearby index: the upgrade's
    # 3.6 GiB of torch and CUDA wheels take ~4 s in the prefetch, before the stop.
    "download_mib_per_s": 1024.0,
    # --fault busy: requests the stop waits for, long enough to see their counts go down.
    "busy_drain_s": 10.0,
}
DEMO_SERVICE: dict[str, Any] = {
    "drain_poll_s": 1.0,
    "drain_timeout_s": 15.0,
    "health_poll_s": 1.0,
    "start_timeout_s": 20.0,
    "min_free_disk_mib": 64,
}


DEFAULT_DIR = Path("demo-run")


async def run_demo(
    *,
    faults: list[str],
    keep_dir: Path | None = None,
    fast: bool = False,
    out: TextIO | None = None,
) -> int:
    """The audit DB lands in ``keep_dir`` (default ./demo-run) so it can be inspected
    afterwards; the simulated host lives in a temporary directory."""
    out = out or sys.stdout
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise InputError(f"unknown fault {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    db_dir = keep_dir if keep_dir is not None else DEFAULT_DIR
    db_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vllm-chatops-demo-") as tmp:
        return await _demo(Path(tmp), db_dir / "chatops.db", faults, fast, out)


async def _demo(root: Path, db: Path, faults: list[str], fast: bool, out: TextIO) -> int:
    # A fault of the model server's API is the new release's (a bad build): the rollback to
    # the build the host booted with serves again, as the story should end.
    sim: dict[str, Any] = {"api_faults_new_build_only": True}
    if "removed_value" in faults:
        # The unit passes the value the new build no longer lists.
        sim["unit_flags"] = (*UNIT_FLAGS, *REMOVED_VALUE)
    config = fast_config(**sim) if fast else HostConfig(**DEMO_TIMINGS, **sim)
    async with SimKit(root / "sim-host", config=config) as kit:
        kit.set_faults(**dict.fromkeys(faults, True))
        # The readiness checks run too: the model served, a smoke completion, /version.
        fragment = kit.settings_fragment(**READY_SETTINGS, **({} if fast else DEMO_SERVICE))
        settings = Settings(**fragment, db_path=db)
        out.write(
            f"simulated GPU host {kit.hostname} on 127.0.0.1:{kit.port} "
            f"(8 GPUs, vllm {kit.installed_version} serving)"
            + (f", faults: {', '.join(faults)}" if faults else "")
            + "\n"
        )
        async with open_runtime(settings) as rt:
            # Through the engine: it binds the host key, as execute() checks it again.
            plan = rt.engine.plan(Action.REDEPLOY, SERVICE, version=DEMO_VERSION, index="nightly")
            asked = await rt.operations.request(
                plan, by=Operator(REQUESTER, source=Source.DEMO, approver=APPROVER)
            )
            if not isinstance(asked, Requested):
                raise ChatOpsError(f"the demo's request was refused: {asked.text}")
            record = asked.record
            out.write(
                f"run #{record.id} requested by {REQUESTER}; approved by {APPROVER} "
                "(in Slack the requester alone can never approve)\n\n"
            )
            # With --fault orphan_workers the demo's approver lets the run end the workers
            # that outlived the stop (in Slack: the card's Terminate button).
            gate = TerminalGate(rt, APPROVER, approve=True, ask=None, out=out)
            sink = TerminalSink(out, redact=rt.redact)
            try:
                result = await rt.engine.execute(record.id, sink, gate=gate)
            finally:
                sink.close()  # a line held back, when the run raised before its end
            out.write(f"\naudit log (also: python -m bot audit --db {db}):\n")
            say(out, runs_table(await rt.audit.list_runs(limit=5)))
        out.write(f"host now: unit {kit.unit_state()}, vllm {kit.installed_version}\n")
    return 0 if result.status in (RunStatus.SUCCEEDED, RunStatus.ROLLED_BACK) or faults else 1
