#!/usr/bin/env python3
"""Map a pasted AutoModel / torch.distributed error (or traceback) to its rule, cause and fix.

Same arguments as `automodel-dist explain` (run with --help).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _entry import run  # noqa: E402

run("explain")
