"""``python -m ps.launch``: the job launcher (see launcher/launch.py and docs/launcher.md)."""
from launcher.launch import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
