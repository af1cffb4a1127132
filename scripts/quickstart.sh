#!/usr/bin/env bash
# The main job on a built-in default, from a fresh clone: set up, then check a layout.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
automodel-dist validate tests/examples/qwen3_moe_30b_te_chat_thd.yaml
automodel-dist mesh tests/examples/qwen3_moe_30b_te_chat_thd.yaml --world-size 16 --gpus-per-node 8 --rank 0
