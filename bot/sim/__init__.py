"""A simulated 8-GPU host for tests and the demo.

The simulated ``systemctl``, ``nvidia-smi``, ``uv``, ``journalctl`` and ``pgrep``
(``bot/sim/bin``) are separate processes sharing one state directory, so the
same host can be reached through an embedded asyncssh server or a real OpenSSH
``sshd``.  Tests and the demo use ``bot.sim.kit.SimKit``.

This package must stay importable with the standard library only (the tools run
under ``python -S``); only ``server``, ``sshd`` and ``kit`` use asyncssh.
"""
