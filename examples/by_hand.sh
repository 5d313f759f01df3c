#!/usr/bin/env bash
# A 2-server, 2-worker dist_sync job on this machine with every process started by hand
# with the DMLC_* variables, as on a cluster without a launcher (installs ps into ./.venv).
# The workers run examples/numpy_sync.py (numpy, no MXNet) and print what they pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
.venv/bin/python -m pip install -q -e . 2>&1 | grep -v -i warning || true
PY=.venv/bin/python
export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=2
export DMLC_PS_ROOT_PORT=$($PY -c 'from ps.netutil import free_port; print(free_port())')
export PS_VERBOSE=${PS_VERBOSE:-1}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
DMLC_ROLE=scheduler $PY -m ps & pids+=($!)
DMLC_ROLE=server $PY -m ps & pids+=($!)
DMLC_ROLE=server $PY -m ps & pids+=($!)
DMLC_ROLE=worker $PY examples/numpy_sync.py & pids+=($!)
DMLC_ROLE=worker $PY examples/numpy_sync.py & pids+=($!)
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
trap - EXIT
echo "demo finished with exit status $status"
exit $status
