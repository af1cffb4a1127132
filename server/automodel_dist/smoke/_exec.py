"""Exec torchrun with a parent-death signal, so a killed parent never leaves ranks behind.

``python -m automodel_dist.smoke._exec <argv...>``: on Linux, ask the kernel to SIGKILL this
process when its parent dies (PR_SET_PDEATHSIG survives exec), then exec ``argv``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys


def set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def main() -> None:
    argv = sys.argv[1:]
    if not argv:
        sys.exit("usage: python -m automodel_dist.smoke._exec PROGRAM [ARGS...]")
    set_pdeathsig()
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
