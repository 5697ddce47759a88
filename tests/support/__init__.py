"""Helpers shared by test modules and benchmarks: simulated-host settings, a manual
clock, the CLI as an operator runs it. Fixtures live in tests/conftest.py."""
