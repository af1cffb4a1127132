#!/usr/bin/env python3
"""Run the layout for real on N local processes and compare with one process.

Same arguments as `automodel-dist smoke` (run with --help).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _entry import run  # noqa: E402

run("smoke")
