#!/usr/bin/env python3
"""Per-GPU memory, communication and step time of a config's layout.

Same arguments as `automodel-dist estimate` (run with --help).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _entry import run  # noqa: E402

run("estimate")
