#!/usr/bin/env python3
"""AutoModel's own training step for a recipe at full size and world size, on fake tensors: its real per-GPU memory.

Same arguments as `automodel-dist dryrun` (run with --help). Needs NeMo AutoModel, torch and transformers installed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _entry import run  # noqa: E402

run("dryrun")
