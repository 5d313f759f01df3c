"""PS_SECRET_FILE: one shared secret -> one CURVE key pair that every node derives.

Every socket of an authenticated cluster uses CURVE with that pair: ROUTERs as servers,
DEALERs as clients. A peer without the secret cannot complete the handshake (it does not
know the servers' public key, which is never sent in clear), so it cannot register, send
data or end the job; all traffic is encrypted.
"""
from __future__ import annotations

import hashlib

import zmq
from zmq.utils import z85

from .errors import ConfigError


def read_secret(path: str, name: str = "PS_SECRET_FILE") -> bytes:
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"{name}={path!r} cannot be read: {exc.strerror}") from None
    if len(secret) < 16:
        raise ConfigError(f"{name}={path!r} holds {len(secret)} bytes; use at least 16 "
                          "random bytes (e.g. `head -c 32 /dev/urandom | base64 > FILE`)")
    return secret


def curve_keys(secret: bytes) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys derived from the shared secret."""
    if not zmq.has("curve"):
        raise ConfigError("PS_SECRET_FILE is set but this libzmq has no CURVE support")
    seed = hashlib.blake2b(secret, digest_size=32, person=b"ps-curve-v1").digest()
    secret_key = z85.encode(seed)
    return zmq.curve_public(secret_key), secret_key


def hmac_key(secret: bytes) -> bytes:
    """A separate key for signing payloads (the pickled optimizer)."""
    return hashlib.blake2b(secret, digest_size=32, person=b"ps-hmac-v1").digest()


NO_KEY = ("start it with python -m ps.launch on one machine (a key per job by default), or give every "
          "process the same PS_JOB_KEY_FILE or PS_SECRET_FILE (docs/security.md)")


def signing_key(secret_file: str | None, job_key_file: str | None) -> bytes | None:
    """The key pickled optimizers are signed with: the cluster's secret, else the job key
    the launcher writes (PS_JOB_KEY_FILE); None: this job signs nothing, so unpickles nothing."""
    if secret_file:
        return hmac_key(read_secret(secret_file))
    if job_key_file:
        return hmac_key(read_secret(job_key_file, "PS_JOB_KEY_FILE"))
    return None
