#!/usr/bin/env python3
"""Ranked layouts that fit a model on a cluster, with YAML and rationale.

Same arguments as `automodel-dist suggest` (run with --help).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _entry import run  # noqa: E402

run("suggest")
