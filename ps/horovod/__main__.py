"""``python -m ps.horovod --path``: the directory to put first on ``PYTHONPATH`` so that
``import horovod.torch as hvd`` gets ps (for ranks a bare ``mpirun``/``srun`` starts;
``python -m ps.launch`` does it itself)."""
from __future__ import annotations

import sys

from ..exitcodes import CONFIG
from . import HOROVOD_PATH, installed_horovod


def main(argv: list[str]) -> int:
    if argv == ["--path"]:
        print(HOROVOD_PATH)
        found = installed_horovod()
        if found:
            print(f"ps.horovod: this path shadows the Horovod installed at {found}", file=sys.stderr)
        return 0
    print(f"usage: python -m ps.horovod --path  (got {' '.join(argv)!r})", file=sys.stderr)
    return CONFIG


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
