#!/usr/bin/env python3
"""Check a recipe or distributed: block: every finding with its YAML line and fix.

Same arguments as `automodel-dist validate` (run with --help).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _entry import run  # noqa: E402

run("validate")
