#!/usr/bin/env bash
# One command on a GPU machine: bash benchmarks/gpu/run.sh --out gpu-out [run.py options]
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root: run.py imports kvagent from here
exec "${PYTHON:-python3}" benchmarks/gpu/run.py "$@"
