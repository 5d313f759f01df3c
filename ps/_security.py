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


def read_secret(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"PS_SECRET_FILE={path!r} cannot be read: {exc.strerror}") from None
    if len(secret) < 16:
        raise ConfigError(f"PS_SECRET_FILE={path!r} holds {len(secret)} bytes; use at least 16 "
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
    """A separate key for signing payloads (the opt-in pickled optimizer)."""
    return hashlib.blake2b(secret, digest_size=32, person=b"ps-hmac-v1").digest()
