"""Every job the launcher starts on this machine gets its own signing key.

Without ``PS_SECRET_FILE`` or ``PS_JOB_KEY_FILE`` the launcher writes a fresh random key
for the job (a 0600 file in a 0700 directory of its own, removed when the job ends) and
gives its path to every process as ``PS_JOB_KEY_FILE``: workers sign a pickled MXNet
optimizer with it and servers unpickle only what it signs, so a script's own
``mx.optimizer.Optimizer`` subclass runs on the servers with no opt-in, and nothing from a
peer without the key is unpickled. The key does not secure the traffic (``PS_SECRET_FILE``
does: CURVE; not the default, see docs/security.md for why and what it costs).

``--launcher ssh`` hands the key to every remote shell over its ssh connection (stdin, never
argv or the environment); the shell keeps it in a 0600 ``mktemp`` file that its watchdog
removes when the connection closes (ssh.py). ``--launcher kubernetes`` puts a fresh key in the
job's Secret (kubernetes.py). Other launchers with processes on other machines get a key only
from the user (a file every host can read). ``--no-auth`` turns it off.
"""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping

from .hosts import is_loopback
from .spec import LaunchSpec

logger = logging.getLogger(__name__)


def all_local(spec: LaunchSpec) -> bool:
    """Every process runs on this machine (so they all read the same file), or gets the key
    over its ssh connection."""
    if spec.launcher in ("local", "ssh"):
        return True
    return spec.launcher in ("ssh", "mpi") and bool(spec.hosts) and all(is_loopback(h.name) for h in spec.hosts)


def new_key() -> str:
    """A fresh random signing key (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


@contextlib.contextmanager
def job_secret(spec: LaunchSpec, environ: Mapping[str, str], enabled: bool = True) -> Iterator[str | None]:
    """The path of a fresh per-job secret, or None where the job keeps what it has."""
    given = ("PS_SECRET_FILE", "PS_JOB_KEY_FILE")
    if not enabled or any(n in environ for n in given) or any(k in given for k, _ in spec.env):
        yield None
        return
    if not all_local(spec):
        logger.info("processes on other hosts (--launcher %s): no per-job key, so MXNet optimizers ps has no numpy version "
                    "of cannot run on the servers (set PS_JOB_KEY_FILE or PS_SECRET_FILE to a file every "
                    "host can read; docs/security.md)", spec.launcher)
        yield None
        return
    folder = tempfile.mkdtemp(prefix="ps-job-")       # 0700
    path = os.path.join(folder, "secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(new_key())
    try:
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)
