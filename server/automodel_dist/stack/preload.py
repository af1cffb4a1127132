"""Imported by the fork servers the smoke runner (on AutoModel's stack) and the dry run start their ranks from, and
by a dry-run rank started on its own: AutoModel, transformers and the modules its build and step use load once, not
once per rank (several seconds each on a busy CPU). Importing starts no thread, so the fork server stays safe to fork
from."""

from __future__ import annotations

import time

_START = time.perf_counter()

from . import shims  # noqa: E402

shims.import_automodel()

import nemo_automodel.components.distributed.context_parallel  # noqa: E402,F401
import nemo_automodel.components.loss  # noqa: E402,F401
import nemo_automodel.components.optim.optimizer  # noqa: E402,F401
import nemo_automodel.components.training.utils  # noqa: E402,F401
import nemo_automodel.recipes._dist_utils  # noqa: E402,F401
import transformers  # noqa: E402,F401

from . import step  # noqa: E402,F401

SECONDS = round(time.perf_counter() - _START, 3)
"""How long the import took: a rank forked after it reports it as its own import phase (dry_run/worker.py)."""
DONE = time.time()
"""When it ended, on the wall clock the parent reads too (dry_run/run.py: what of it a run waited for)."""
