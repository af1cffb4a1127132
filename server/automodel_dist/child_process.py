"""What the tool's child processes share (the smoke run's launcher and ranks, the dry run's ranks): dying with the
process that started them."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys


def set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux's PR_SET_PDEATHSIG, which survives
    exec; a no-op elsewhere), so a killed parent never leaves it running."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass
