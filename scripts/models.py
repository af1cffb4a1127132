#!/usr/bin/env python3
"""The built-in model and GPU catalogs (what --model and --gpu accept).

Same arguments as `automodel-dist models` (run with --help).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _entry import run  # noqa: E402

run("models")
