#!/usr/bin/env bash
# Sets up .venv with everything units-lightning needs, from nothing but python3 (3.10+).
# Idempotent: a second run only re-installs the project itself.
#   scripts/setup.sh            # runtime + test dependencies
#   PYTHON=python3.12 scripts/setup.sh
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 scripts/setup.sh   # torch from that index
#   TORCH_INDEX_URL=default scripts/setup.sh                                   # torch from pip's usual indexes
# torch: on a machine without an NVIDIA GPU (no working nvidia-smi) the CPU build from PyTorch's CPU index (torch
# takes about 0.7 GB installed; the CUDA build 5.3 GB with its nvidia and triton packages), else, or when that index
# cannot be reached, the build pip's usual indexes give (on Linux from PyPI: the CUDA build). The last line says which.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
# Quiet pip; drop the notices about configured package indexes that hold nothing for a package.
pip_() {
  "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
pip_ install --upgrade pip setuptools wheel

TORCH=("torch==2.14.1" "torchvision==0.29.1")
CPU_INDEX=https://download.pytorch.org/whl/cpu
reachable() {  # an index answers within 10 s (pip itself would retry an unreachable one for minutes)
  "$VENV/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=10)" \
    "$1" >/dev/null 2>&1
}
if ! "$VENV/bin/python" -c "import torch, torchvision" 2>/dev/null; then
  index=${TORCH_INDEX_URL:-}
  if [ -z "$index" ] && ! nvidia-smi -L >/dev/null 2>&1; then
    if reachable "$CPU_INDEX"; then
      index=$CPU_INDEX
    else
      echo "[setup] no NVIDIA GPU, but $CPU_INDEX cannot be reached: torch from pip's usual indexes"
    fi
  fi
  installed=
  if [ -n "$index" ] && [ "$index" != default ]; then
    echo "[setup] installing torch and torchvision from $index"
    # pip's own complaint is shown for an index the user chose, not for the CPU index tried on their behalf.
    errors=/dev/stderr
    [ -n "${TORCH_INDEX_URL:-}" ] || errors=/dev/null
    if pip_ install --index-url "$index" "${TORCH[@]}" 2>"$errors"; then
      installed=1
    else
      echo "[setup] $index did not give ${TORCH[*]}: torch from pip's usual indexes"
    fi
  fi
  if [ -z "$installed" ]; then
    echo "[setup] installing torch and torchvision"
    pip_ install "${TORCH[@]}" || pip_ install torch torchvision
  fi
fi

if ! "$VENV/bin/python" -c "import learn2learn" >/dev/null 2>&1; then
  # learn2learn 0.2.0's shipped C files predate Python 3.11: rebuild them with a current Cython,
  # and skip its declared requirements (gsutil, qpth -> numpy<2) that MAML does not need.
  echo "[setup] building learn2learn 0.2.0"
  pip_ install cython numpy scipy tqdm requests "gym>=0.26"
  pip_ install --no-build-isolation --no-deps -C--build-option=build_ext "learn2learn==0.2.0"
fi

echo "[setup] installing units-lightning (editable) with test extras"
pip_ install -e ".[test]"
"$VENV/bin/python" - <<'PY'
import lightning, torch, units_lightning, wandb
from units_lightning.engines.learn2learn import import_learn2learn

build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
print(f"[setup] ok: units_lightning {units_lightning.__version__} | torch {torch.__version__} ({build}) | "
      f"lightning {lightning.__version__} | learn2learn {import_learn2learn().__version__} | wandb {wandb.__version__}")
PY
