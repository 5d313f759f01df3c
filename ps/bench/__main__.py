"""``python -m ps.bench``: see ps/bench/cli.py and docs/benchmarks.md; with ``--hosts K``,
the multi-host benchmark on network-namespace hosts (ps/bench/multihost.py)."""
import sys

if __name__ == "__main__":
    if any(a == "--hosts" or a.startswith("--hosts=") for a in sys.argv[1:]):
        from .multihost import main
    else:
        from .cli import main
    raise SystemExit(main())
