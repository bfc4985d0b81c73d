#!/usr/bin/env bash
# Φ on CUDA in one command, from the repo root: `bash bench/gpu_check.sh` (or `--only kernel,speed`).
# Uses $PYTHON, else python3; installs nothing (put trl, datasets, pydantic, sqlite-utils, tomli-w on
# PYTHONPATH first where the image lacks them). Skips cleanly without CUDA. About 5 minutes on an H100.
set -u
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
