#!/usr/bin/env bash
# Wheel smoke test (CI: .ci/run): build the wheel, install it in a clean venv as a user would
# (torch==2.13.0 first, then the wheel with the framework extras under constraints.txt), and from a
# scratch directory outside the checkout, with the checkout not on sys.path, run every README
# Python example, every script of examples/, the presets by name, `replay` on a real log and `--version`
# (scripts/smoke_wheel.py). Any failure exits non-zero with the failing step's output.
#   PYTHON=python3.11 bash scripts/smoke_wheel.sh      # KEEP=1: keep the scratch directory
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-hf,lightning,deepspeed,report}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/stability-wheel-smoke.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then echo "smoke: scratch directory $WORK (kept)"; else trap 'rm -rf "$WORK"' EXIT; fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset PYTHONPATH
t0=$SECONDS

"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
# torch first and pinned: any other torch spec pulls several GB of CUDA wheels.
"$VPY" -m pip install -q torch==2.13.0
# A stale build/lib would slip files the checkout no longer has into the wheel.
rm -rf "$ROOT/build"
"$VPY" -m pip wheel -q --no-deps -w "$WORK/dist" "$ROOT"
WHEEL=$(ls "$WORK"/dist/stability_callbacks-*.whl)
echo "smoke: built $(basename "$WHEEL") ($((SECONDS - t0))s)"
"$VPY" -m pip install -q -c "$ROOT/constraints.txt" "$WHEEL[$EXTRAS]"
# TRL as its users have it, beside the package (examples/trl_sft.py): the callback needs nothing of it.
"$VPY" -m pip install -q -c "$ROOT/constraints.txt" trl
echo "smoke: clean venv with torch 2.13.0, the wheel [$EXTRAS] and trl ready ($((SECONDS - t0))s)"

mkdir "$WORK/run"
cd "$WORK/run"
"$VPY" -I "$ROOT/scripts/smoke_wheel.py" "$ROOT/README.md" \
    "$ROOT/tests/data/real_logs/bs_tr8_104B_exp12_spike8740_diverge9027.log"
echo "smoke: done in $((SECONDS - t0))s"
