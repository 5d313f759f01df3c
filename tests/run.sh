#!/usr/bin/env bash
# The test command: installs what the suite needs on a fresh Debian machine (Debian
# packages when run as root, Python packages into ./.venv), then runs pytest on three xdist
# workers, on two cores, so that a test waiting on a timeout or a link leaves its core to the
# others: the fast tier (no processes, no sockets) first, then the tests marked `process`
# (tests/conftest.py orders them; the files that share the machine run on one worker).
# Extra arguments go to pytest, e.g. `bash tests/run.sh tests/unit -x`,
# `bash tests/run.sh -m "not process"` for the fast tier alone, `-n 0` for one process.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  wanted=()
  if [ -f tests/infra/apt-packages.txt ]; then
    while read -r pkg; do
      pkg=${pkg%%#*}; pkg=${pkg// /}
      [ -n "$pkg" ] && ! dpkg -s "$pkg" >/dev/null 2>&1 && wanted+=("$pkg")
    done < tests/infra/apt-packages.txt
  fi
  updated=""
  if [ ${#wanted[@]} -gt 0 ]; then
    echo "tests/run.sh: apt-get install ${wanted[*]}"
    apt-get update -qq && updated=1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null
  fi
  if [ -f tests/infra/sge_install.sh ] && ! [ -x /usr/sbin/sge_qmaster ]; then
    echo "tests/run.sh: installing gridengine (tests/infra/sge_install.sh)"
    [ -n "$updated" ] || apt-get update -qq
    bash tests/infra/sge_install.sh >/dev/null
  fi
fi

PY=${PYTHON:-python3}
if ! [ -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v -i "warning" || true
# torch 2.13.0: a CPU build (here it is on this machine's package index; any newer release
# resolves to a CUDA build of several GB)
.venv/bin/python -m pip install -q -e '.[test,mxnet,bench,demo,torch,dashboard]' 'torch==2.13.0' 2>&1 | grep -v -i "warning" || true
# The suite starts ~1,500 Python processes: with PYTHONDONTWRITEBYTECODE set (some CI images
# set it) each would compile the project's modules again (~50 ms of CPU each). Compiled once here,
# and the tests' processes may write what they compile.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 0 ps launcher tests examples \
  || echo "tests/run.sh: compileall could not compile the file above (the tests that import it will fail)"
exec .venv/bin/python -m pytest -n 3 "$@"
