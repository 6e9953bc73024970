#!/usr/bin/env bash
# swarm-bench gpu-check on a bare GPU machine, as one command: install the wheels that travel
# with the working tree (made beforehand with `swarm-bench gpu-wheels`, in .gpu-wheels/), run the
# check, and leave its JSON and logs in $OUT. The machine needs Python 3.12+ with torch (CUDA),
# transformers 5, peft, msgpack and numpy; nothing is fetched from a network.
#
#   bash bench/gpu_check.sh [more gpu-check arguments]      (from the repository root or anywhere)
#
# Environment: OUT (results folder, default ./gpu-check-out), PYTHON (default python3),
# GPU_WHEELS (default .gpu-wheels), GPU_CHECK_TOTAL_S (seconds for install and check together,
# default 450: the check gets what the install leaves), GPU_CHECK_WORK (models and runs, default
# /tmp/echo-swarm-gpu-work; never under $OUT, the models are gigabytes).
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT="${OUT:-$PWD/gpu-check-out}"
WHEELS="${GPU_WHEELS:-.gpu-wheels}"
PY="${PYTHON:-python3}"
TOTAL="${GPU_CHECK_TOTAL_S:-450}"
WORK="${GPU_CHECK_WORK:-/tmp/echo-swarm-gpu-work}"
mkdir -p "$OUT" "$WORK"
LOG="$OUT/gpu_check.sh.log"
say() { echo "gpu_check.sh: $*" | tee -a "$LOG"; }

say "python $("$PY" -c 'import sys; print(sys.version.split()[0])'), $(nproc) cores, $(uname -sr)"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || say "nvidia-smi failed (see $OUT/nvidia-smi.txt)"
ROOTS=$(sed -n 's/.*"install": "[^"]*--find-links [^ ]* \(.*\)".*/\1/p' "$WHEELS/manifest.json" 2>/dev/null)
if [ -z "$ROOTS" ]; then
  say "no $WHEELS/manifest.json: run \`swarm-bench gpu-wheels\` on a machine with PyPI first and carry $WHEELS"
  exit 2
fi

# Where the wheels go: nowhere if everything imports already (a machine set up before); into
# $PY's own environment if it is a virtual environment (an ML image's usual python); else into a
# new virtual environment that sees the system's torch, transformers and peft; else the user site.
NEEDED="import libp2p, trio, zstandard, ifaddr, gguf, starlette, torch, transformers, peft"
HAVE="import torch, transformers, peft"
INSTALL=(-m pip install --no-index --find-links "$WHEELS/wheels" $ROOTS)
VENV=/tmp/echo-swarm-gpu-venv
RUN="$PY"
if "$PY" -c "$NEEDED" >>"$LOG" 2>&1; then
  say "everything imports with $PY: nothing installed"
elif "$PY" -c "import sys; sys.exit(sys.prefix == sys.base_prefix)"; then
  say "installing into $PY's virtual environment"
  "$PY" "${INSTALL[@]}" >>"$LOG" 2>&1
elif "$PY" -m venv --system-site-packages "$VENV" >>"$LOG" 2>&1 && "$VENV/bin/python" -c "$HAVE" >>"$LOG" 2>&1 \
     && "$VENV/bin/python" -m pip --version >>"$LOG" 2>&1; then
  say "installing into $VENV (it sees the system's torch)"
  RUN="$VENV/bin/python"
  "$RUN" "${INSTALL[@]}" >>"$LOG" 2>&1
else
  say "installing into the user site"
  "$PY" "${INSTALL[@]}" --user >>"$LOG" 2>&1 || "$PY" "${INSTALL[@]}" --user --break-system-packages >>"$LOG" 2>&1
fi
say "install done after $(( $(date +%s) - START )) s ($ROOTS; pip's output in $LOG)"
"$RUN" -c "import libp2p, trio, zstandard, ifaddr, gguf, fastecdsa, torch, transformers, peft; \
print('imports ok: torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)" \
  2>&1 | tail -3 | tee -a "$LOG"

BUDGET=$(( TOTAL - ($(date +%s) - START) - 15 ))
say "gpu-check with a budget of $BUDGET s"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
  "$RUN" -m bench.cli gpu-check --device cuda --out "$OUT/gpu-check" --work "$WORK" \
  --default-skeleton "$WHEELS/default-skeleton" --budget-s "$BUDGET" "$@" 2>&1 | tee "$OUT/gpu-check.txt"
RC=${PIPESTATUS[0]}
cp "$OUT/gpu-check/gpu-check.json" "$OUT/gpu-check.json" 2>/dev/null || say "no gpu-check.json was written"
say "gpu-check exit $RC after $(( $(date +%s) - START )) s in all; results in $OUT"
exit "$RC"
