"""Where the tests' inputs lie."""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SKILL_DIR = ROOT / "skills" / "nemo-automodel-distributed-training"  # what `npx skills add` installs
EXAMPLES = Path(os.environ.get("AUTOMODEL_DIST_EXAMPLES", TESTS / "examples"))
MODELS = TESTS / "models"  # config.json files of models the catalog does not hold
CALIBRATION = TESTS / "calibration"  # AutoModel's published H100 runs and their recipes
GOLDEN = TESTS / "golden"
