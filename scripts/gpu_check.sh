#!/usr/bin/env bash
# One short CUDA check of kvspec's device path; exits non-zero on any mismatch. Needs torch with CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import kvspec" 2>/dev/null; then
  python3 -m pip install -q --no-deps -e . || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -c "import beartype, typing_extensions" 2>/dev/null || python3 -m pip install -q beartype typing-extensions
exec python3 scripts/gpu_check.py
