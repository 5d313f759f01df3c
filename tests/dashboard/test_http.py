"""The dashboard's HTTP server on its own (no job: the scheduler's picture is made up), and the
launcher's refusal of a port in use: bad requests are refused and nothing else is affected;
with PS_SECRET_FILE every request needs the token."""
from __future__ import annotations

import json
import logging
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ps.config import Config
from ps.dashboard import Dashboard
from ps.dashboard.server import token_of
from ps.jobview import JobFacts, JobView, NodeFacts
from tests.helpers import PYTHON
from tests.launcher.launch_util import Launch

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

FACTS = JobFacts("running", "dist_sync", 1, 1, 0, 1.0, (
    NodeFacts(8, "S[8]", "server", 0, "127.0.0.1", "box", 100, 0.0, 0, "alive"),
    NodeFacts(9, "W[9]", "worker", 0, "127.0.0.1", "box", 101, 0.0, 0, "alive")))


def dashboard(listen: str = "127.0.0.1:0", **env: str) -> Dashboard:
    cfg = Config.from_env({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "1", "DMLC_NUM_SERVER": "1",
                           "DMLC_NUM_WORKER": "1", "DMLC_ROLE": "scheduler", "PS_DASHBOARD": listen, **env})
    view = JobView()
    view.report(9, {"step": 7, "bytes_sent": 10})
    return Dashboard(cfg, view, lambda: FACTS)


@pytest.fixture
def dash():
    d = dashboard()
    yield d
    d.close()


def raw(port: int, request: bytes, timeout: float = 10) -> bytes:
    """Send bytes as they are; the whole answer (the server closes the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def status(answer: bytes) -> int:
    """The status line's code; a request line it could not read is answered without one
    (as HTTP/0.9), its body then starts with the code."""
    if answer.startswith(b"HTTP/"):
        return int(answer.split(b" ", 2)[1])
    return int(answer.split(b" ", 1)[0])


def still_serves(d: Dashboard) -> None:
    code, body, _ = get(f"http://127.0.0.1:{d.port}/api/job")
    assert code == 200 and json.loads(body)["state"] == "running"


def test_every_endpoint_answers_and_the_page_is_locked_down(dash):
    base = f"http://127.0.0.1:{dash.port}"
    code, page, headers = get(base + "/")
    assert code == 200 and b"static/app.js" in page
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for name in ("app.js", "style.css"):
        assert get(f"{base}/static/{name}")[0] == 200
    state = json.loads(get(base + "/api/state")[1])
    assert set(state) == {"job", "nodes", "history", "stalls", "events"}
    for part in ("job", "nodes", "history", "stalls", "events"):
        assert type(json.loads(get(f"{base}/api/{part}")[1])) is type(state[part]), part
    nodes = json.loads(get(base + "/api/nodes")[1])
    assert [(n["role"], n["rank"], n["step"]) for n in nodes] == [("server", 0, None), ("worker", 0, 7)]
    families = {f.name: f for f in text_string_to_metric_families(get(base + "/metrics")[1].decode())}
    [step] = families["ps_node_step"].samples
    assert step.value == 7 and step.labels == {"role": "worker", "rank": "0", "host": "127.0.0.1"}
    assert get(base + "/../etc/passwd")[0] == 404 and get(base + "/static/../server.py")[0] == 404


@pytest.mark.parametrize("request_bytes, code", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /api/job HTTP/9.9\r\n\r\n", 505),
    (b"GET /" + b"a" * 100_000 + b" HTTP/1.0\r\n\r\n", 414),
    (b"GET / HTTP/1.0\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n", 431),
    (b"POST /api/job HTTP/1.0\r\nContent-Length: 10000000000\r\n\r\n", 405),
    (b"DELETE / HTTP/1.0\r\n\r\n", 405),
    (b"BREW / HTTP/1.0\r\n\r\n", 501),
])
def test_a_bad_request_is_refused_and_nothing_else_is_affected(dash, request_bytes, code):
    assert status(raw(dash.port, request_bytes)) == code
    still_serves(dash)


def test_a_client_that_sends_nothing_does_not_hold_the_server(dash):
    idle = [socket.create_connection(("127.0.0.1", dash.port), timeout=5) for _ in range(5)]
    try:
        still_serves(dash)
    finally:
        for s in idle:
            s.close()


def test_with_a_secret_every_request_needs_the_token(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32)
    d = dashboard(PS_SECRET_FILE=str(secret))
    try:
        base, token = f"http://127.0.0.1:{d.port}", token_of(b"s" * 32)
        assert d.url.endswith(f"?token={token}")
        for path in ("/", "/metrics", "/api/state", "/static/app.js"):
            assert get(base + path)[0] == 401, path
        assert get(base + "/api/job?token=" + "0" * len(token))[0] == 401
        code, _, headers = get(d.url)
        assert code == 200 and f"ps_token={token}" in headers["Set-Cookie"] and "HttpOnly" in headers["Set-Cookie"]
        assert get(base + "/api/job", {"Cookie": f"other=1; ps_token={token}"})[0] == 200
        code, body, _ = get(base + "/metrics", {"Authorization": f"Bearer {token}"})
        assert code == 200 and any(f.name == "ps_node_up" for f in text_string_to_metric_families(body.decode()))
    finally:
        d.close()


def test_bound_to_this_machine_it_answers_only_requests_addressed_to_it(dash):
    """A page elsewhere whose name resolves to 127.0.0.1 (DNS rebinding) cannot read it."""
    assert status(raw(dash.port, b"GET /api/job HTTP/1.0\r\nHost: evil.example:%d\r\n\r\n" % dash.port)) == 401
    for host in (b"localhost", b"127.0.0.1", b"[::1]"):
        assert status(raw(dash.port, b"GET /api/job HTTP/1.0\r\nHost: %s:%d\r\n\r\n" % (host, dash.port))) == 200


def test_listening_beyond_this_machine_without_a_secret_warns(caplog):
    caplog.set_level(logging.WARNING, "ps.scheduler")
    d = dashboard("0.0.0.0:0")          # bound only: the test sends nothing beyond loopback
    d.close()
    assert "without PS_SECRET_FILE: anyone who can reach that port sees the job" in caplog.text
    caplog.clear()
    dashboard().close()
    assert caplog.text == ""


def test_a_port_in_use_refuses_the_job_before_it_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        launch = Launch(["-n", "1", "-s", "1", "--dashboard", str(port), PYTHON, "-c", "print('worker ran')"])
        try:
            assert launch.wait(30) == 1
        finally:
            launch.cleanup()
    assert f"PS_DASHBOARD=127.0.0.1:{port}: the dashboard cannot listen there: Address already in use" in \
        launch.output
    assert "worker ran" not in launch.output and "[worker" not in launch.output


@pytest.mark.parametrize("value", ["x", "host:", "99999", ":80"])
def test_a_bad_dashboard_address_is_named(value):
    launch = Launch(["-n", "1", "--dashboard", value, PYTHON, "-c", "pass"])
    try:
        assert launch.wait(30) == 2
    finally:
        launch.cleanup()
    assert f"--dashboard: PS_DASHBOARD must be [HOST:]PORT" in launch.output and repr(value) in launch.output
