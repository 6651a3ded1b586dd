#!/usr/bin/env bash
# Sets up .venv with everything units-lightning needs, from nothing but python3 (3.10+).
# Idempotent: a second run only re-installs the project itself.
#   scripts/setup.sh            # runtime + test dependencies
#   PYTHON=python3.12 scripts/setup.sh
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

if ! "$VENV/bin/python" -c "import torch, torchvision" 2>/dev/null; then
  echo "[setup] installing torch and torchvision"
  pip_ install "torch==2.14.1" "torchvision==0.29.1" \
    || pip_ install torch torchvision
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

print(f"[setup] ok: units_lightning {units_lightning.__version__} | torch {torch.__version__} | "
      f"lightning {lightning.__version__} | learn2learn {import_learn2learn().__version__} | wandb {wandb.__version__}")
PY
