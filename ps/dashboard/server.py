"""The dashboard's HTTP server: a thread of the scheduler's process, apart from its I/O.

Who may look: by default only this machine (127.0.0.1). With PS_SECRET_FILE every request
needs the dashboard token, derived from the secret (so whoever holds the secret can make
it, and it opens nothing else): ``?token=`` in the URL the launcher prints (answered with a
cookie the page then sends), or ``Authorization: Bearer`` (Prometheus' ``authorization``).
Bound elsewhere without a secret, anyone who reaches the port sees the job: the scheduler
warns.

What it refuses: any method but GET and HEAD (405), a request line or header over the
standard library's limits (414, 431), more than MAX_CONNECTIONS at once (closed unanswered),
a client silent for TIMEOUT seconds (closed). Nothing it reads is unpickled or evaluated.
"""
from __future__ import annotations

import hashlib
import hmac
import http.server
import ipaddress
import json
import logging
import socket
import threading
from importlib import resources
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .._security import read_secret
from ..config import Config
from ..errors import PSError
from ..jobview import JobFacts, JobView
from .metrics import registry

logger = logging.getLogger("ps.scheduler")

MAX_CONNECTIONS = 32
TIMEOUT = 10.0              # s a connection may take to send its request
COOKIE = "ps_token"
PARTS = ("job", "nodes", "history", "stalls", "events")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def token_of(secret: bytes) -> str:
    """The dashboard token: a hash of the cluster's secret under a purpose of its own."""
    return hashlib.blake2b(secret, digest_size=16, person=b"ps-dashboard-v1").hexdigest()


def _static() -> dict[str, bytes]:
    """The page's files, read once (package data)."""
    files = {}
    for item in resources.files(__package__).joinpath("static").iterdir():
        if item.is_file() and not item.name.startswith("."):
            files[item.name] = item.read_bytes()
    return files


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _host_of(header: str) -> str:
    """The name in a Host header, without its port (``[::1]:8787`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Dashboard:
    """Listens at once (a port in use fails the scheduler's start, before any node is
    started); ``url`` is what to open; ``close()`` stops it."""

    def __init__(self, config: Config, view: JobView, facts: Callable[[], JobFacts]):
        listen = config.dashboard
        assert listen is not None
        self.token = token_of(read_secret(config.secret_file)) if config.secret_file else None
        self.view, self.facts = view, facts
        self.loopback_only = _loopback(listen.host)
        self.metrics = registry(view, facts)
        self.files = _static()
        family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        server_class = type("Server", (_Server,), {"address_family": family})
        try:
            self.httpd = server_class((listen.host, listen.port), _Handler)
        except OSError as exc:
            raise PSError(f"PS_DASHBOARD={listen.host}:{listen.port}: the dashboard cannot listen there: "
                          f"{exc.strerror or exc} (another program on that port? choose another, or port 0 "
                          "for any free one)") from None
        self.httpd.dashboard = self
        host, port = self.httpd.server_address[:2]
        self.port = port
        shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
        shown = f"[{shown}]" if ":" in shown else shown
        self.url = f"http://{shown}:{port}/" + (f"?token={self.token}" if self.token else "")
        if not _loopback(listen.host) and self.token is None:
            logger.warning("scheduler: the dashboard listens on %s:%d without PS_SECRET_FILE: anyone who can "
                           "reach that port sees the job (hosts, ranks, rates; nothing that changes it). Set "
                           "PS_SECRET_FILE to require a token, or listen on 127.0.0.1 and use an SSH tunnel "
                           "(docs/security.md)", listen.host, port)
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="ps-dashboard", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()

    def allowed(self, handler: http.server.BaseHTTPRequestHandler, query: dict[str, list[str]]) -> str | None:
        """None if the request may see the job; else why not. Bound to this machine only, it
        answers only requests addressed to it by a loopback name (a web page whose own name was
        made to resolve to 127.0.0.1, DNS rebinding, cannot read it). The token may come in the
        query, a bearer header, or the cookie the page got."""
        if self.loopback_only and not _loopback(_host_of(handler.headers.get("Host", ""))):
            return "this dashboard answers only requests for 127.0.0.1 or localhost (the Host header)"
        if self.token is None:
            return None
        offered = query.get("token", [None])[0]
        auth = handler.headers.get("Authorization", "")
        if offered is None and auth.startswith("Bearer "):
            offered = auth[7:].strip()
        if offered is None:
            for part in handler.headers.get("Cookie", "").split(";"):
                name, _, value = part.strip().partition("=")
                if name == COOKIE:
                    offered = value
        if offered is None:
            return "this dashboard needs its token (the URL python -m ps.launch printed has it)"
        if not hmac.compare_digest(offered.encode(), self.token.encode()):
            return "wrong dashboard token"
        return None

    def api(self, part: str) -> bytes:
        state = self.view.state(self.facts())
        return json.dumps(state if part == "state" else state[part], allow_nan=False).encode()

    def prometheus(self) -> bytes:
        return generate_latest(self.metrics)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    dashboard: Dashboard

    def __init__(self, *args: Any, **kwargs: Any):
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)      # too many at once: closed, the scheduler unaffected
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    timeout = TIMEOUT
    server_version = "ps-dashboard"
    sys_version = ""
    error_message_format = "%(code)d %(message)s: %(explain)s\n"
    error_content_type = "text/plain; charset=utf-8"

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _refuse_method(self) -> None:
        self._send(405, b"read-only: GET or HEAD\n", "text/plain; charset=utf-8", True, {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse_method

    def _answer(self, body: bool) -> None:
        dash = self.server.dashboard
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        why = dash.allowed(self, query)
        if why is not None:
            self._send(401, f"{why}\n".encode(), "text/plain; charset=utf-8", body)
            return
        path = url.path
        extra = {}
        if "token" in query:        # the page's own requests then carry it (and the URL bar need not)
            extra["Set-Cookie"] = f"{COOKIE}={dash.token}; HttpOnly; SameSite=Strict; Path=/"
        try:
            if path in ("/", "/index.html"):
                self._send(200, dash.files["index.html"], _TYPES[".html"], body, extra)
            elif path.startswith("/static/") and path[8:] in dash.files:
                name = path[8:]
                self._send(200, dash.files[name], _TYPES.get(name[name.rfind("."):], "application/octet-stream"),
                           body)
            elif path == "/metrics":
                self._send(200, dash.prometheus(), CONTENT_TYPE_LATEST, body)
            elif path.startswith("/api/") and path[5:] in ("state", *PARTS):
                self._send(200, dash.api(path[5:]), "application/json", body)
            else:
                self._send(404, b"not found: / (the page), /metrics, /api/state, /api/job, /api/nodes, "
                                b"/api/history, /api/stalls, /api/events\n", "text/plain; charset=utf-8", body)
        except (ConnectionError, socket.timeout):
            pass                            # the client went away
        except Exception:                   # a bug here must not end the scheduler's process
            logger.exception("dashboard: answering %s failed", path)
            self._send(500, b"internal error\n", "text/plain; charset=utf-8", body)

    def _send(self, code: int, data: bytes, ctype: str, body: bool, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, value in {**_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        logger.debug("dashboard: %s %s", self.address_string(), format % args)

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.info("dashboard: %s %s", self.address_string(), format % args)
