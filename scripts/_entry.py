"""Shared start of the skill's scripts: run one automodel-dist command, or say how to install it."""

from __future__ import annotations

import os
import sys


def install_hint() -> str:
    """One line telling the user how to install the package these scripts drive."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(root, "pyproject.toml")):
        source = f'"{root}"'
    else:
        source = "<a checkout of the nemo-automodel-distributed-training repository>"
    return f"automodel-dist is not installed in this Python: pip install {source}"


def run(command: str) -> None:
    """Run `automodel-dist <command> <argv...>` and exit with its status (2 when not installed)."""
    try:
        from automodel_dist.cli import main
    except ImportError:
        sys.stderr.write(install_hint() + "\n")
        sys.exit(2)
    sys.exit(main([command, *sys.argv[1:]]))
