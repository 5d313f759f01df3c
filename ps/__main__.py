"""``python -m ps``: run the scheduler or server role named by DMLC_ROLE.

Exit status 0 at a clean job end; 78 (``ps.exitcodes.CONFIG``) with a one-line reason on
stderr for what no restart can fix (a missing or malformed variable, an unreadable secret
file, a bad command line); 1 with a one-line reason for any other failure.
``python -m ps --mxnet-autoload-path`` prints the directory to put on PYTHONPATH so that
plain ``import mxnet`` scripts get ps's kvstores (docs/mxnet.md).
"""
from __future__ import annotations

import sys


def main(environ=None, argv=None) -> int:
    if argv:                      # only from the command line: ps.mxnet calls main() too
        return _command(argv)
    from . import _logging, exitcodes
    from .config import Config
    from .errors import PSError

    try:
        cfg = Config.from_env(environ)
        _check_secrets(cfg)
    except PSError as exc:
        print(f"ps: {exc}", file=sys.stderr)
        return exitcodes.CONFIG
    _logging.setup(cfg.verbose)     # logger names (ps.server, ps.scheduler) say which role
    try:
        if cfg.is_scheduler:
            from .scheduler import Scheduler
            sched = Scheduler(cfg)
            sched.start()
            code = sched.run()
            if code:
                print(f"ps scheduler: {sched.error}", file=sys.stderr)
            return code
        if cfg.is_server:
            from .server import KVServer, keep_freed
            keep_freed(cfg.server_malloc_keep)         # a server process alone: not a joint one's
            server = KVServer(cfg)
            code = server.run()
            if code:
                print(f"ps server: {server.error}", file=sys.stderr)
            return code
    except PSError as exc:
        print(f"ps {cfg.role}: {exc}", file=sys.stderr)
        return exitcodes.FAILED
    except KeyboardInterrupt:
        print(f"ps {cfg.role}: interrupted", file=sys.stderr)
        return exitcodes.INTERRUPTED
    print(f"ps: DMLC_ROLE={cfg.role}: run your training script instead of `python -m ps`", file=sys.stderr)
    return exitcodes.CONFIG


def _check_secrets(cfg) -> None:
    """Read the secret files now: one that cannot be read, or is too short, fails the same
    way after any restart, so it must end the process with CONFIG, before the role starts
    (where the same ConfigError would look like any other failure)."""
    from ._security import curve_keys, read_secret, signing_key
    if cfg.secret_file:
        curve_keys(read_secret(cfg.secret_file))
    signing_key(cfg.secret_file, cfg.job_key_file)


def _command(argv) -> int:
    from .exitcodes import CONFIG
    if list(argv) == ["--mxnet-autoload-path"]:
        from .mxnet_autoload import MXNET_AUTOLOAD
        print(MXNET_AUTOLOAD)
        return 0
    print(f"usage: python -m ps [--mxnet-autoload-path]  (got {' '.join(argv)!r}); the role comes "
          "from DMLC_ROLE", file=sys.stderr)
    return CONFIG


if __name__ == "__main__":
    sys.exit(main(argv=sys.argv[1:]))
