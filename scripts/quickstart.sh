#!/usr/bin/env bash
# The main job on a built-in default, from a fresh clone: set up, then smoke-test FSDP2 + TP 2 on
# 4 CPU processes (torch elastic launcher, gloo) through AutoModel's own stack (Llama-3.1-8B's architecture at tiny
# dims) against a single-process reference.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
automodel-dist smoke --world-size 4
