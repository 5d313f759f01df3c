#!/usr/bin/env bash
# The project's main job, on this machine: install ps (with MXNet 1.9.1)
# into ./.venv, train a small convolutional network on handwritten digits with 2 workers and
# 2 servers (`python -m ps.launch`; examples/train_digits.py is a plain Gluon script with
# kvstore='dist_sync' and no `import ps`), then train it in one process and compare.
# Extra arguments go to the training script (e.g. --epochs 3). PS_VERBOSE=1 shows ps's log.
# --dashboard[=[HOST:]PORT] (default port 8787) serves the job's live dashboard: open the URL it
# prints while it trains (it then trains 60 epochs unless --epochs says otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
PY=.venv/bin/python
dashboard=() script_args=()
for arg in "$@"; do
  case "$arg" in
    --dashboard) dashboard=(--dashboard 8787) ;;
    --dashboard=*) dashboard=(--dashboard "${arg#--dashboard=}") ;;
    *) script_args+=("$arg") ;;
  esac
done
if [ ${#dashboard[@]} -gt 0 ] && [[ " ${script_args[*]-} " != *" --epochs"* ]]; then
  script_args+=(--epochs 60)      # time to open the page and watch
fi
set -- "${script_args[@]+"${script_args[@]}"}"
if ! $PY -c "import ps.mxnet_autoload, mxnet, prometheus_client" >/dev/null 2>&1; then
  echo "demo: installing ps, MXNet 1.9.1 and prometheus_client into ./.venv (once)"
  $PY -m pip install -q -e '.[demo]' 2>&1 | grep -v -i warning || true
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "demo: python -m ps.launch -n 2 -s 2 --launcher local ${dashboard[*]-} python examples/train_digits.py $*"
$PY -m ps.launch -n 2 -s 2 --launcher local "${dashboard[@]+"${dashboard[@]}"}" $PY examples/train_digits.py \
  --results "$out/ps.json" "$@"
echo "demo: the same training in one process (kvstore='local'), for comparison"
$PY examples/train_digits.py --kvstore local --quiet --results "$out/one.json" "$@"

$PY - "$out/ps.json" "$out/one.json" <<'PY'
import json, sys
ps, one = (json.load(open(path)) for path in sys.argv[1:])
gap = 100 * (ps["test_accuracy"] - one["test_accuracy"])
print(f"summary: test accuracy {ps['test_accuracy']:.3f} with {ps['workers']} workers x 2 servers on ps "
      f"(dist_sync), {one['test_accuracy']:.3f} in one process ({gap:+.1f} points)")
print(f"         step time {ps['step_ms']:.1f} ms on ps, {one['step_ms']:.1f} ms in one process "
      f"(median of {ps['steps']} steps; here all 5 processes share this machine's CPUs)")
print(f"         {ps['bytes_per_step'] / 1e6:.3f} MB moved per step by each worker: its gradients out and "
      f"the weights back, {ps['parameters']:,} parameters = {4 * ps['parameters'] / 1e6:.3f} MB each way")
PY
