"""The one-process references of test_torch.py, all in one process: each is a worker script's
``--local`` run (its ``main()`` with that command line), one after the other, as
``hvd.init()``/``hvd.shutdown()`` allow. A process of its own for each would import torch and
torch._dynamo (~3 s of CPU) six times for a few milliseconds of training each.

    python local_refs.py OUT.json SCRIPT ARG... [-- SCRIPT ARG...]...

writes {"SCRIPT ARG...": RESULT, ...}: each run's one RESULT line, keyed by its command line.
"""
import contextlib
import importlib.util
import io
import json
import os
import sys


def run(script: str, args: list[str]) -> dict:
    spec = importlib.util.spec_from_file_location(f"ref_{os.path.basename(script)[:-3]}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    argv, sys.argv = sys.argv, [script, *args, "--local"]
    try:
        with contextlib.redirect_stdout(out):
            module.main()
    finally:
        sys.argv = argv
    found = [ln for ln in out.getvalue().splitlines() if ln.startswith("RESULT ")]
    if len(found) != 1:
        raise SystemExit(f"{script} {' '.join(args)} --local printed {len(found)} RESULT lines:\n{out.getvalue()}")
    return json.loads(found[0][len("RESULT "):])


def main() -> None:
    out, *rest = sys.argv[1:]
    commands, current = [], []
    for word in rest + ["--"]:
        if word == "--":
            commands.append(current)
            current = []
        else:
            current.append(word)
    found = {" ".join(command): run(command[0], command[1:]) for command in commands if command}
    with open(out, "w") as fh:
        json.dump(found, fh)


if __name__ == "__main__":
    main()
