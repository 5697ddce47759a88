"""The faults ``python -m bot demo --fault`` offers, named here without the simulator:
every command line builds the demo's help, and only ``demo`` imports ``bot.sim``.

They are the simulator's fault switches (``bot.sim.state.Faults``) but ``uv_stalls``,
which makes an install hang until the install timeout: a test knob, not a demo.
``tests/test_cli.py`` holds the two lists equal."""

from __future__ import annotations

DEMO_FAULTS: tuple[str, ...] = (
    "stuck_worker",
    "uv_fails",
    "uv_fails_always",
    "prefetch_fails",
    "uv_floods",
    "resolve_fails",
    "health_503",
    "start_fails",
    "no_driver",
    "wrong_model",
    "smoke_fail",
    "smoke_empty",
    "busy",
    "oom_at_start",
    "engine_dies_after_ready",
    "engine_hangs_after_ready",
    "torch_cuda_mismatch",
    "import_error",
    "stale_plugin",
    "index_drops_old",
    "uv_fails_midway",
    "xid_79",
    "pending_remap",
    "ecc_uncorrected",
    "unified_memory",
    "no_gpus",
    "orphan_workers",
    "d_state_worker",
    "reset_required",
    "mig_xid",
    "cu128_on_cuda_12_7",
    "cu129_wheels",
    "duplicate_dist_info",
    "metrics_no_vllm",
    "usage_thread_exception",
    "removed_flag",
    "pcie_degraded",
    "hw_slowdown",
    "driver_mismatch",
    "dcgmi_present",
    "dcgmi_fails",
    "nvlink_down",
    "fabric_stuck",
)
