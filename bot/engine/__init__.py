"""Drives runs: the engine, the executor, the run life cycle, recovery and the runtime."""
