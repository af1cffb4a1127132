"""Imported by the smoke launcher's fork server before it forks the ranks of a run on AutoModel's stack: AutoModel,
transformers and the modules its build and step use load once, not once per rank (several seconds each on a busy
CPU). Importing starts no thread, so the fork server stays safe to fork from."""

from __future__ import annotations

from . import shims

shims.import_automodel()

import nemo_automodel.components.distributed.context_parallel  # noqa: E402,F401
import nemo_automodel.components.loss  # noqa: E402,F401
import nemo_automodel.components.optim.optimizer  # noqa: E402,F401
import nemo_automodel.components.training.utils  # noqa: E402,F401
import nemo_automodel.recipes._dist_utils  # noqa: E402,F401
import transformers  # noqa: E402,F401

from . import step  # noqa: E402,F401
