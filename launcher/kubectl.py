"""--launcher kubernetes talks to the cluster only through ``kubectl``: this is that client.

Shelling out keeps ps pure Python with no client library (the ``kubernetes`` package and its
dependencies unpack to ~74 MB), and uses the user's kubectl exactly as configured: the
kubeconfig and its context, exec credential plugins, a pod's service account. Every call is
bounded in time, and a call that fails or is not answered says which command it was.
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

CALL_TIMEOUT = 30.0      # seconds one kubectl request may take (kubectl's own --request-timeout: 20s)
DELETE_WAIT = 60         # seconds a deletion waits for the job's pods to be gone


class KubectlError(RuntimeError):
    """kubectl failed, was not answered in time, or is not installed; the message says which call."""


class Kubectl:
    """The kubectl on PATH, with the job's namespace on every call once it is known."""

    def __init__(self, environ: Mapping[str, str], namespace: str | None = None):
        exe = shutil.which("kubectl", path=environ.get("PATH", os.defpath))
        if exe is None:
            raise KubectlError("kubectl is not on PATH: --launcher kubernetes submits and follows the job with it "
                               "(install it and point it at the cluster, e.g. `kubectl get pods` works); "
                               "--dry-run needs no kubectl")
        self.exe, self.env, self.namespace = exe, dict(environ), namespace

    def argv(self, *args: str) -> list[str]:
        ns = ["--namespace", self.namespace] if self.namespace else []
        return [self.exe, *ns, *args]

    def shown(self, *args: str) -> str:
        """The command as a user would type it (``kubectl``, not its path)."""
        return shlex.join(["kubectl", *self.argv(*args)[1:]])

    def run(self, *args: str, stdin: str | None = None, timeout: float = CALL_TIMEOUT) -> str:
        argv = self.argv(*args)
        logger.debug("run: %s", self.shown(*args))       # -v
        feed: dict[str, Any] = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        try:
            done = subprocess.run(argv, check=False, capture_output=True, text=True, env=self.env, timeout=timeout, **feed)
        except subprocess.TimeoutExpired:
            raise KubectlError(f"`{self.shown(*args)}` got no answer within {timeout:g}s") from None
        except OSError as exc:
            raise KubectlError(f"`{self.shown(*args)}` could not run: {exc}") from None
        if done.returncode:
            reason = done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}"
            raise KubectlError(f"`{self.shown(*args)}` failed: {reason}")
        return done.stdout

    def json(self, *args: str, stdin: str | None = None, timeout: float = CALL_TIMEOUT) -> Any:
        out = self.run(*args, "-o", "json", stdin=stdin, timeout=timeout)
        try:
            return json.loads(out)
        except ValueError:
            raise KubectlError(f"`{self.shown(*args, '-o', 'json')}` printed no JSON: {out[:200]!r}") from None

    def server_version(self) -> tuple[int, int]:
        info = self.json("version", "--request-timeout=20s")
        server = info.get("serverVersion") if isinstance(info, dict) else None
        if not server:
            raise KubectlError("`kubectl version` names no server version: is the cluster reachable?")
        try:
            return int(server["major"].rstrip("+")), int("".join(c for c in server["minor"] if c.isdigit()))
        except (KeyError, ValueError, AttributeError):
            raise KubectlError(f"`kubectl version`: cannot read the server version {server!r}") from None

    def context_namespace(self) -> str:
        """The current context's namespace, as ``kubectl create`` without --namespace would use."""
        out = self.run("config", "view", "--minify", "-o", "jsonpath={..namespace}")
        return out.strip() or "default"

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create one object, given on stdin (so a Secret's data never reaches argv)."""
        return self.json("create", "-f", "-", "--request-timeout=20s", stdin=json.dumps(obj))

    def delete_job(self, name: str, wait: int = DELETE_WAIT) -> None:
        """Delete the root Job and, before it, everything it owns (foreground cascade)."""
        self.run("delete", "job", name, "--cascade=foreground", "--ignore-not-found", "--wait=true",
                 f"--timeout={wait}s", timeout=wait + 15)
