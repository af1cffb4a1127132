"""What AutoModel 0.7.0 needs from the torch release it runs on. Pure: versions are compared as text,
torch is never imported here."""

from __future__ import annotations

import re
from functools import cache

# AutoModel 0.7.0's FSDP2 parallelizers (components/distributed/parallelizer.py and
# components/moe/parallelizer.py) call fsdp_patches.patch_fsdp_accumulated_grad_guard(), which reads
# FSDPParam.to_accumulated_grad_if_needed: present in torch 2.11-2.14, removed in torch 2.15.
FSDP2_PATCH_REMOVED_IN = (2, 15)

_VERSION = re.compile(r"\s*v?(\d+)\.(\d+)(?:\.\d+)?(?:[a-z]+\d*)?(?:\.dev\d+)?(?:\+[\w.]+)?\s*$")


def torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string such as ``2.15.0+cu132`` or ``2.16.0.dev20260101``."""
    m = _VERSION.match(version) if isinstance(version, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def fsdp2_unusable(release: tuple[int, int]) -> bool:
    """True when AutoModel 0.7.0's FSDP2 parallelizers fail on this torch release (AttributeError)."""
    return release >= FSDP2_PATCH_REMOVED_IN


# What running AutoModel's own code here needs (the dry run, the smoke run on AutoModel's stack): module -> what to
# install
AUTOMODEL_STACK = {"torch": "torch", "nemo_automodel": "nemo-automodel==0.7.0", "transformers": "transformers"}


def missing_packages() -> list[str]:
    """What running AutoModel's own code needs and this environment lacks (found without importing anything)."""
    import importlib.util

    missing = []
    for module, pkg in AUTOMODEL_STACK.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(pkg)
    return missing


@cache
def installed_automodel() -> str | None:
    """The version of the nemo-automodel distribution installed beside this tool (its metadata only: the package
    is not imported), or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nemo-automodel")
    except PackageNotFoundError:
        return None
