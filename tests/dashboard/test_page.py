"""The dashboard's page (ps/dashboard/static) in a real headless Chromium, driven by selenium.

For now the page talks to a stand-in scheduler: a thread running http.server that serves the
real static files and an /api/state whose numbers advance from one call to the next (and
that reports a stall from its third call on), with the scheduler's Content-Security-Policy.
The checks are functions of a driver and a base URL (check_page, check_stall,
check_console, ...) so that a fixture running a real ps job can take the stand-in's place."""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    pytest.skip("selenium is not installed (pip install selenium)", allow_module_level=True)
for _path in (CHROMIUM, CHROMEDRIVER):
    if not os.access(_path, os.X_OK):
        pytest.skip(f"{_path} is missing (apt-get install chromium chromium-driver)", allow_module_level=True)

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]

STATIC = Path(__file__).resolve().parents[2] / "ps" / "dashboard" / "static"
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'"
WINDOW = (1280, 900)
NODES = ["worker-0", "worker-1", "server-0", "server-1"]


# ---------------------------------------------------------------- the checks


class Console:
    """The browser's console log. driver.get_log empties it, so what each read returns is
    kept here for the checks that come later."""

    def __init__(self, driver) -> None:
        self.driver = driver
        self.entries: list[dict] = []

    def read(self) -> list[dict]:
        self.entries += self.driver.get_log("browser")
        return self.entries


def wait(driver, timeout: float, message: str, condition):
    """WebDriverWait whose condition may meet an element the page has just replaced."""
    return WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(condition, message)


def row(driver, node: str):
    return driver.find_element(By.CSS_SELECTOR, f'#nodes tr[data-node="{node}"]')


def cell(driver, node: str, column: str) -> str:
    return row(driver, node).find_element(By.CSS_SELECTOR, f"td.col-{column}").text


def live_numbers(driver, nodes: list[str]) -> dict[str, tuple[str, str]]:
    return {n: (cell(driver, n, "step"), cell(driver, n, "last-heard")) for n in nodes}


def check_page(driver, url: str, expect_nodes: list[str], timeout: float = 30) -> None:
    """Opens the page: the header shows a job state, every node has its row, and the rows'
    numbers (step / rounds, last heard) change within a few seconds."""
    driver.get(url)
    wait(driver, timeout, "the header never showed the job's state",
         lambda d: d.find_element(By.ID, "job-state").text.lower() in ("forming", "running")
         or d.find_element(By.ID, "job-state").text.lower().startswith("ended"))
    for node in expect_nodes:
        wait(driver, timeout, f"no row for {node} in #nodes",
             lambda d, node=node: d.find_elements(By.CSS_SELECTOR, f'#nodes tr[data-node="{node}"]'))
    for node in expect_nodes:
        r = row(driver, node)
        for column in ("role", "rank", "host", "pid", "state", "last-heard", "restarts", "cpu", "rss",
                       "in", "out", "in-flight", "step"):
            assert r.find_elements(By.CSS_SELECTOR, f"td.col-{column}"), f"{node}'s row has no col-{column} cell"
        state = r.find_element(By.CSS_SELECTOR, "td.col-state").text
        assert state in ("alive", "silent", "dead", "closed", "ended"), f"{node}'s state is {state!r}"
    assert driver.find_element(By.ID, "job-size").text, "the header does not show the job's size"
    first = live_numbers(driver, expect_nodes)
    time.sleep(2)
    wait(driver, 5, f"no node's step or last-heard cell changed in 2 s and more (first look: {first})",
         lambda d: live_numbers(d, expect_nodes) != first)


def check_stall(driver, who: str = "worker 1", timeout: float = 30) -> None:
    """#stalls names ``who`` as what a stall waits for."""
    wait(driver, timeout, f"#stalls never named {who!r}",
         lambda d: any(who in e.text for e in d.find_elements(By.CSS_SELECTOR, "#stalls .stall-waiting-for")))
    text = driver.find_element(By.ID, "stalls").text
    assert "no stalls" not in text, text


def check_console(console: Console, allow_network_errors: bool = False) -> None:
    """No console entry of level SEVERE or WARNING. With ``allow_network_errors``, the
    browser's own note of a failed request for api/state (source "network") is let through:
    a page cannot keep Chromium from logging it; anything the page's script logged or threw
    still fails."""
    bad = [e for e in console.read() if e.get("level") in ("SEVERE", "WARNING")]
    if allow_network_errors:
        bad = [e for e in bad if not (e.get("source") == "network" and "api/state" in e.get("message", ""))]
    assert not bad, "the browser's console has:\n" + "\n".join(
        f"  {e.get('level')} [{e.get('source')}] {e.get('message')}" for e in bad)


def check_lost_contact(driver, timeout: float = 15) -> None:
    """The banner says contact was lost, and the last data stays on the page."""
    wait(driver, timeout, "no lost-contact banner after the scheduler went away",
         lambda d: d.find_element(By.ID, "banner").is_displayed()
         and "lost contact with the scheduler at" in d.find_element(By.ID, "banner").text)
    assert driver.find_elements(By.CSS_SELECTOR, "#nodes tr[data-node]"), "the nodes' rows went away"


def save_screenshots(driver, tmp_path: Path, *more: Path) -> Path:
    """The page's screenshot into pytest's tmp dir, into $PS_TEST_ARTIFACTS as
    dashboard.png when that is set, and to each of ``more``."""
    time.sleep(0.3)                       # a poll's redraw done
    shot = tmp_path / "dashboard.png"
    assert driver.save_screenshot(str(shot)), "no screenshot"
    targets = list(more)
    if os.environ.get("PS_TEST_ARTIFACTS"):
        targets.append(Path(os.environ["PS_TEST_ARTIFACTS"]) / "dashboard.png")
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)
    return shot


# ---------------------------------------------------------------- the stand-in scheduler

HISTORY_BEFORE = 170          # s of history the stand-in has when it starts
HOSTILE = '<img src=x onerror="document.title=1">'


class StandIn:
    """What the scheduler's /api/state would say of a 2 x 2 dist_sync job that has been up a
    while: each call advances the step, and from the third call on worker 1 has gone silent
    and both servers report a sync round stalled waiting for it."""

    def __init__(self) -> None:
        self.started = time.time()
        self.calls = 0
        self.stalled_at: float | None = None
        self.hostile = False
        self.forming = False
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                       name="ps-dash-standin", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.thread.join(10)
        self.server.server_close()

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?", 1)[0]
                if path in ("/", "/index.html"):
                    self._send(200, "text/html; charset=utf-8", (STATIC / "index.html").read_bytes())
                elif path.startswith("/static/") and path[len("/static/"):] in _static_names():
                    name = path[len("/static/"):]
                    kind = {"js": "text/javascript", "css": "text/css", "html": "text/html"}[name.rsplit(".", 1)[1]]
                    self._send(200, kind + "; charset=utf-8", (STATIC / name).read_bytes())
                elif path == "/api/state":
                    body = json.dumps(standin.state()).encode()
                    self._send(200, "application/json", body)
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Security-Policy", CSP)
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args):      # quiet
                pass

        return Handler

    def state(self) -> dict:
        with self.lock:
            self.calls += 1
            calls = self.calls
            now = time.time()
            if calls >= 3 and self.stalled_at is None:
                self.stalled_at = now
            stalled_at = self.stalled_at
        if self.forming:
            return self.forming_state(now, calls)
        start = self.started - HISTORY_BEFORE        # the job's start
        restart_at = start + 95                      # worker 1 died here and came back
        stalled = stalled_at is not None
        step = 1570 + 10 * min(calls, 3)             # a stalled sync job's step stands still
        stall_for = 4.0 + (now - stalled_at) if stalled else 0.0
        wiggle = 0.5 * math.sin(now / 3.1)

        def node(id_, role, rank, hostname, addr, pid, **kw):
            n = {"id": id_, "name": ("W" if role == "worker" else "S") + str(id_), "role": role, "rank": rank,
                 "host": addr, "hostname": hostname, "pid": pid, "state": "alive",
                 "last_heard": round((now * 0.37 + id_ * 0.21) % 0.95, 2), "since": start + 1.2, "restarts": 0,
                 "in_flight": 0, "step": None, "rounds_closed": None}
            n.update(kw)
            return n

        nodes = [
            node(9, "worker", 0, HOSTILE if self.hostile else "trainer-a", "10.0.0.11", 4242,
                 cpu_percent=round(61.3 + 9 * wiggle, 1), rss_bytes=431_000_000,
                 bytes_in_per_s=1.21e6 * (0.1 if stalled else 1), bytes_out_per_s=1.18e6 * (0.1 if stalled else 1),
                 in_flight=2, step=step),
            node(13, "worker", 1, "trainer-b", "10.0.0.12", 4391, since=restart_at + 4, restarts=1,
                 cpu_percent=None if stalled else round(58.0 - 7 * wiggle, 1), rss_bytes=402_000_000,
                 bytes_in_per_s=None if stalled else 1.19e6, bytes_out_per_s=None if stalled else 1.16e6,
                 in_flight=1, step=step - (0 if stalled else 1),
                 **({"state": "silent", "last_heard": round(stall_for, 1)} if stalled else {})),
            node(8, "server", 0, "param-a", "10.0.0.21", 3977, cpu_percent=round(22.4 + 4 * wiggle, 1),
                 rss_bytes=188_500_000, bytes_in_per_s=1.2e6, bytes_out_per_s=1.23e6, rounds_closed=2 * step),
            node(10, "server", 1, "param-b", "10.0.0.22", 3981, cpu_percent=round(19.8 - 3 * wiggle, 1),
                 rss_bytes=186_900_000, bytes_in_per_s=1.17e6, bytes_out_per_s=1.2e6, rounds_closed=2 * step),
        ]

        t, sps, bps, p50, p95 = [], [], [], [], []
        for k in range(int(start) + 1, int(now) + 1):
            t.append(float(k))
            down = restart_at <= k < restart_at + 6                  # no steps while worker 1 was away
            quiet = stalled and k >= stalled_at - 4
            rate = 0.0 if (down or quiet) else 9.6 + 0.7 * math.sin(k / 9) + 0.35 * math.sin(k / 2.3)
            sps.append(None if restart_at + 2 <= k < restart_at + 4 else round(rate, 2))
            bps.append(round(rate * 2.45e5 + 3e3, 0))
            p50.append(None if rate == 0 else round(0.0042 + 0.0006 * math.sin(k / 5), 5))
            p95.append(None if rate == 0 else round(0.0105 + 0.0025 * math.sin(k / 4) + 0.001 * math.sin(k / 1.7), 5))

        def event(t, kind, who, text):
            return {"t": t, "kind": kind, "node": who, "text": text}

        events = [
            event(start + 1.2, "joined", "server 0", "server 0 (S8 on 10.0.0.21, pid 3977) joined"),
            event(start + 1.3, "joined", "server 1", "server 1 (S10 on 10.0.0.22, pid 3981) joined"),
            event(start + 1.4, "joined", "worker 0", "worker 0 (W9 on 10.0.0.11, pid 4242) joined"),
            event(start + 1.5, "joined", "worker 1", "worker 1 (W11 on 10.0.0.12, pid 4388) joined"),
            event(start + 1.5, "formed", None, "the job formed: 2 workers, 2 servers, dist_sync"),
            event(restart_at, "died", "worker 1", "worker 1 (W11 on 10.0.0.12, pid 4388) died: no heartbeat for 10 s"),
            event(restart_at + 4, "restarted", "worker 1", "worker 1 restarted as W13 on 10.0.0.12, pid 4391"),
            event(restart_at + 6, "went_on", None, "the job went on at step 940"),
        ]
        stalls = []
        if stalled:
            events.append(event(stalled_at, "stalled", "worker 1",
                                "server 0: sync round 1601 of keys 3, 4 has waited 4s for worker 1 (W13 on 10.0.0.12)"))
            for rank, keys in ((0, [3, 4]), (1, [5, 6])):
                what = f"sync round 1601 of keys {keys[0]}, {keys[1]}"
                stalls.append({"by": f"server {rank}", "what": what, "keys": keys,
                               "waiting_for": ["worker 1 (W13 on 10.0.0.12)"], "waiting": ["worker 0"],
                               "seconds": round(stall_for, 1),
                               "text": f"server {rank}: {what} has waited {stall_for:.0f}s for worker 1 "
                                       "(W13 on 10.0.0.12, pid 4391, last heard "
                                       f"{stall_for:.1f}s ago); worker 0 has pushed"})
        job = {"state": "running", "kvstore": "dist_sync", "workers": 2, "servers": 2,
               "uptime": round(now - start, 1), "restarts": 1, "step": step,
               "steps_per_second": 0.0 if stalled else round(sps[-1] or 9.5, 2), "ended": None,
               "now": now, "interval": 1.0}
        if self.hostile:
            job.update(state="ended", ended={"code": 1, "reason": "<script>document.title=2</script> died"})
            events.append(event(now, "<b>ended</b>", None, "<b>not bold</b> & <i>not</i>"))
        return {"job": job, "nodes": nodes, "stalls": stalls, "events": events,
                "history": {"t": t, "steps_per_second": sps, "bytes_per_second": bps,
                            "latency_p50": p50, "latency_p95": p95}}

    def forming_state(self, now: float, calls: int) -> dict:
        """A job still forming: one server has registered, nothing is known yet."""
        server = {"id": 8, "name": "S8", "role": "server", "rank": None, "host": "127.0.0.1", "hostname": None,
                  "pid": 3977, "state": "alive", "last_heard": None, "since": now - 0.5, "restarts": 0,
                  "cpu_percent": None, "rss_bytes": None, "bytes_in_per_s": None, "bytes_out_per_s": None,
                  "in_flight": 0, "step": None, "rounds_closed": None}
        return {"job": {"state": "forming", "kvstore": None, "workers": 2, "servers": 2, "uptime": 0.1 * calls,
                        "restarts": 0, "step": None, "steps_per_second": None, "ended": None, "now": now,
                        "interval": 1.0},
                "nodes": [server] if calls > 1 else [], "stalls": [], "events": [],
                "history": {"t": [], "steps_per_second": [], "bytes_per_second": [], "latency_p50": [],
                            "latency_p95": []}}


def _static_names() -> set[str]:
    return {p.name for p in STATIC.iterdir() if p.is_file()}


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def standin():
    s = StandIn()
    yield s
    s.stop()


@pytest.fixture
def driver():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", "--force-device-scale-factor=1",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        d.set_page_load_timeout(30)
        d.set_script_timeout(30)
        d.set_window_size(*WINDOW)
        # headless Chromium's window has room for a toolbar it does not draw: make the page's
        # viewport, and so the screenshot, WINDOW's size
        inner = d.execute_script("return [window.innerWidth, window.innerHeight]")
        if tuple(inner) != WINDOW:
            d.set_window_size(2 * WINDOW[0] - inner[0], 2 * WINDOW[1] - inner[1])
        yield d
    finally:
        d.quit()


# ---------------------------------------------------------------- the tests


def test_the_page_shows_a_live_job(driver, standin, tmp_path):
    console = Console(driver)
    check_page(driver, standin.url, expect_nodes=NODES)
    check_stall(driver, "worker 1")
    assert "silent" in cell(driver, "worker-1", "state")
    assert "worker 1" in driver.find_element(By.ID, "events").text
    newest = driver.find_element(By.CSS_SELECTOR, "#events li.event")
    assert "kind-stalled" in newest.get_attribute("class").split(), "the newest event is not first"
    # the charts have been drawn: some pixels are not blank
    for canvas in ("chart-throughput", "chart-latency"):
        inked = driver.execute_script(
            "const c = document.getElementById(arguments[0]);"
            "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;", canvas)
        assert inked > 1000, f"#{canvas} looks empty ({inked} pixels drawn)"
    save_screenshots(driver, tmp_path)
    check_console(console)


def test_the_page_keeps_its_data_when_the_scheduler_goes_away(driver, standin):
    console = Console(driver)
    driver.get(standin.url)
    wait(driver, 30, "no rows", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#nodes tr[data-node]")) == len(NODES))
    assert not driver.find_element(By.ID, "banner").is_displayed()
    standin.stop()
    check_lost_contact(driver)
    time.sleep(1.5)                       # another failed poll or two: still no error of the page's own
    check_console(console, allow_network_errors=True)


def test_text_from_the_network_is_never_markup(driver, standin):
    standin.hostile = True
    console = Console(driver)
    driver.get(standin.url)
    wait(driver, 30, "the hostile hostname never showed",
         lambda d: d.find_elements(By.CSS_SELECTOR, '#nodes tr[data-node="worker-0"]')
         and cell(d, "worker-0", "host") == HOSTILE)
    wait(driver, 10, "the ended reason never showed",
         lambda d: "<script>" in d.find_element(By.ID, "job-reason").text)
    assert "<b>not bold</b>" in driver.find_element(By.ID, "events").text
    assert not driver.find_elements(By.CSS_SELECTOR, "main img, main b, main i, #job-reason *, body script")
    assert driver.title not in ("1", "2")
    check_console(console)


def test_a_forming_job_with_no_history_yet(driver, standin):
    standin.forming = True
    console = Console(driver)
    driver.get(standin.url)
    wait(driver, 30, "the header never said forming",
         lambda d: d.find_element(By.ID, "job-state").text.lower() == "forming")
    wait(driver, 10, "the registered server's row never showed",
         lambda d: d.find_elements(By.CSS_SELECTOR, '#nodes tr[data-node="server-?"]'))
    assert cell(driver, "server-?", "last-heard") == "never"
    assert driver.find_element(By.ID, "stalls").text == "no stalls"
    assert driver.find_element(By.ID, "events").text == "no events yet"
    time.sleep(1.5)                       # a redraw or two of the empty charts
    check_console(console)


# ---------------------------------------------------------------- a real job


def test_the_page_watches_a_real_job_and_names_a_stopped_worker(driver, job, tmp_path):
    """python -m ps.launch --dashboard: every node's row, live numbers, and a worker stopped
    with SIGSTOP named as what the servers' rounds wait for (PS_STALL_WARNING=1)."""
    j = job("--env", "PS_STALL_WARNING:1")
    console = Console(driver)
    check_page(driver, j.url, expect_nodes=["worker-0", "worker-1", "server-0", "server-1"])
    stopped = j.pid(1)
    os.kill(stopped, signal.SIGSTOP)
    try:
        check_stall(driver, "worker 1")
        wait(driver, 10, "worker 1 never showed as silent",
             lambda d: cell(d, "worker-1", "state") == "silent")
        save_screenshots(driver, tmp_path)
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait(driver, 20, "the stall did not clear once worker 1 went on",
         lambda d: "no stalls" in d.find_element(By.ID, "stalls").text)
    assert "went on" in driver.find_element(By.ID, "events").text
    check_console(console)
    assert j.stop() == 0
