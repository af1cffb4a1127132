"""Exec torchrun with a parent-death signal, so a killed parent never leaves ranks behind.

``python -m automodel_dist.smoke._exec <argv...>``: on Linux, ask the kernel to SIGKILL this
process when its parent dies (PR_SET_PDEATHSIG survives exec), then exec ``argv``.
"""

from __future__ import annotations

import os
import sys

from ..child_process import set_pdeathsig


def main() -> None:
    argv = sys.argv[1:]
    if not argv:
        sys.exit("usage: python -m automodel_dist.smoke._exec PROGRAM [ARGS...]")
    set_pdeathsig()
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
