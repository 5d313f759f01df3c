"""``python -m ps.bench``: see ps/bench/cli.py and docs/benchmarks.md."""
from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
