#!/usr/bin/env bash
# Install torch into the venv before anything else, so no dependency pulls a multi-GB CUDA build.
# - a machine with a working CUDA torch in the base interpreter: the venv was created with
#   --system-site-packages (see Makefile) and that torch is kept;
# - otherwise: the CPU build torch==2.13.0.
set -euo pipefail
py="$1"
if "$py" - <<'PY' 2>/dev/null
import torch, sys
sys.exit(0 if torch.cuda.is_available() else 1)
PY
then
  echo "[install] keeping the CUDA torch $("$py" -c 'import torch;print(torch.__version__)')"
  exit 0
fi
if "$py" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  echo "[install] torch 2.13.0 already installed"
  exit 0
fi
echo "[install] no CUDA: installing the CPU build torch==2.13.0"
"$py" -m pip install -q torch==2.13.0
