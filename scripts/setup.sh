#!/usr/bin/env bash
# Set up a working environment from a fresh clone: a .venv (unless one is active), the CPU torch
# wheel pinned first (an unpinned torch pulls a multi-GB CUDA build), numpy, this package with
# its test extra, and NeMo AutoModel 0.7.0 (no deps) as the differential-test oracle, with the
# transformers release it pins (its parallelizers import it; the oracle runs them on a tiny model).
# Source it to stay in the venv: `. scripts/setup.sh`.
set -euo pipefail
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$_root"
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
_pip() { python -m pip install -q --disable-pip-version-check "$@"; }
python -c "import torch, numpy" 2>/dev/null || _pip "torch==${TORCH_VERSION:-2.13.0}" numpy
_pip -e ".[test]" -c constraints.txt   # constraints: see the file
python -c "import nemo_automodel" 2>/dev/null || _pip --no-deps "nemo-automodel==0.7.0" packaging
python -c "import transformers" 2>/dev/null || _pip "transformers==5.18.0"
# a few of AutoModel's model modules (Bagel, DeepSeek-V4, Nemotron-Parse) import these at import time; the capability
# table's freshness test (tools/gen_capabilities.py --check) imports every registered class
python -c "import einops, PIL" 2>/dev/null || _pip "einops==0.8.2" "pillow==13.0.0"
# AutoModel 0.7.0's pin for distributed.strategy: megatron_fsdp (pure Python; the dry run runs it on fake tensors)
python -c "import megatron_fsdp" 2>/dev/null || _pip --no-deps "megatron-fsdp==0.5.0"
python -c "import automodel_dist, torch; print('automodel-dist ready (torch', torch.__version__ + ')')"
