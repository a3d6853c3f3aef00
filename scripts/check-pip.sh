#!/usr/bin/env bash
# check-pip.sh -- `pip install .` into a fresh virtual environment (CMAKE_ARGS=-DKVA_CUDA=OFF
# unless CMAKE_ARGS is set: the CUDA build is checked by `make build`), then imports kvattn and
# runs one attention call with numpy from outside the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(mktemp -d /tmp/kvattn-venv.XXXXXX)
trap 'rm -rf "$VENV"' EXIT
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
export CMAKE_ARGS=${CMAKE_ARGS:--DKVA_CUDA=OFF}
t0=$(date +%s)
"$VENV/bin/python" -m pip install -q . numpy
echo "pip install . done ($(( $(date +%s) - t0 )) s)"
(cd "$VENV" && "$VENV/bin/python" - <<'PY'
import numpy as np
import kvattn
q = np.ones((4, 8, 64), np.float32)
k = np.ones((6, 2, 64), np.float32)
o = kvattn.attention(q, k, k, causal=True)
assert o.shape == q.shape and np.allclose(o, 1.0)
print("import kvattn from the installed wheel: ok (%s, %s)" % (kvattn.__version__, kvattn._ext.__file__.rsplit("/", 1)[-1]))
PY
)
