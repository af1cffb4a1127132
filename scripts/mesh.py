#!/usr/bin/env python3
"""AutoModel's device/moe meshes and each rank's groups, without GPUs.

Same arguments as `automodel-dist mesh` (run with --help).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _entry import run  # noqa: E402

run("mesh")
