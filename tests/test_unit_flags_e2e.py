"""The unit's flags against the new build, end to end over the simulated host's real sshd:
its `systemctl show` prints ExecStart, Environment= and EnvironmentFiles as systemd 252
does, its EnvironmentFile is a real file read with the real cat, and the throwaway venv's
`vllm serve --help=all` is in current vLLM's shape (`--optimization-level`, no `-O`,
choices)."""

from __future__ import annotations

from pathlib import Path

from bot.core.status import RunStatus
from bot.engine.runtime import open_runtime
from bot.sim.kit import fast_config
from bot.sim.state import DEFAULT_VERSION
from tests.support.sim import MakeSimHost, sim_settings
from tests.test_environment_e2e import NEW, never_stopped, no_throwaway_venv, redeploy


async def test_minus_o3_in_the_unit_passes(make_sim_host: MakeSimHost, tmp_path: Path) -> None:
    # The new build's help lists --optimization-level and no -O, as vLLM 0.33.0's does: its
    # parser reads -O3 as --optimization-level 3, so the unit is good.
    kit = await make_sim_host(
        access="sshd",
        config=fast_config(unit_flags=("--served-model-name", "kimi-k2.5", "-O3")),
    )
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
    assert result.status == RunStatus.SUCCEEDED, out
    assert f"every flag of the unit's ExecStart (4) is accepted by vllm {NEW}" in out, out
    assert kit.installed_version == NEW


async def test_a_removed_flag_in_vllm_args_is_refused_before_the_stop(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # ExecStart passes `$VLLM_ARGS`, set in an EnvironmentFile to `--task generate`, which
    # the new build dropped: `systemctl show` prints the word unexpanded; the bot reads the
    # file and expands it as systemd would, then refuses before the stop.
    env_file = tmp_path / "vllm.env"
    env_file.write_text('# flags\nHF_TOKEN=hf_not_a_token\nVLLM_ARGS="--task generate"\n')
    kit = await make_sim_host(
        access="sshd",
        config=fast_config(
            unit_flags=("--served-model-name", "${SERVED}", "$VLLM_ARGS"),
            unit_environment=("SERVED=kimi-k2.5",),
            unit_env_files=(str(env_file), f"-{tmp_path}/absent.env"),
        ),
    )
    kit.set_faults(removed_flag=True)
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
    assert result.status == RunStatus.ABORTED, out
    assert result.summary.startswith(
        f"refused before the stop; service untouched: `--task` is not accepted by vllm {NEW}"
    ), result.summary
    assert never_stopped(kit) and kit.unit_state() == "active"
    assert kit.installed_version == DEFAULT_VERSION
    assert no_throwaway_venv(kit)
    assert "hf_not_a_token" not in out


async def test_a_removed_choice_value_is_refused_before_the_stop(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # The new build no longer lists xxhash among --prefix-caching-hash-algo's choices:
    # argparse would refuse it when the server starts, after the stop.
    kit = await make_sim_host(
        access="sshd",
        config=fast_config(
            unit_flags=("--served-model-name", "kimi-k2.5", "--prefix-caching-hash-algo=xxhash")
        ),
    )
    kit.set_faults(removed_value=True)
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        result, out = await redeploy(rt, version=NEW, index="nightly")
    assert result.status == RunStatus.ABORTED, out
    assert result.summary == (
        "refused before the stop; service untouched: `--prefix-caching-hash-algo xxhash` "
        f"(it takes sha256, sha256_cbor, xxhash_cbor) is not accepted by vllm {NEW} (the "
        "unit's ExecStart passes it; change the unit first)"
    ), result.summary
    assert never_stopped(kit) and kit.unit_state() == "active"
    assert kit.installed_version == DEFAULT_VERSION
