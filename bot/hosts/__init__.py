"""Reaching GPU hosts: the transport interface beside its SSH, local and pool
implementations; the fleet fan-out; NVML on this machine."""
