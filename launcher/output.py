"""Where process output goes: one console line per output line, prefixed with its source
(``[worker 1] ...``), plus one log file per source with --log-dir."""
from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable
from typing import IO

# A process line "<EXIT_MARKER> <status>" (from tracker.rank_wrapper) reports a task's exit.
EXIT_MARKER = "ps-launch: exit status"

# Maps a raw output line to the (source name, text) lines it carries (none to swallow it).
Labeler = Callable[[str], Iterable[tuple[str, str]]]


class IdCatcher:
    """A label function that records the first group of ``pattern`` (a batch job id) and
    passes every line through under ``name``; ``swallow`` hides the matching lines."""

    def __init__(self, pattern: str, name: str, swallow: bool = False):
        self.pattern, self.name, self.swallow = re.compile(pattern), name, swallow
        self.ids: list[str] = []

    def __call__(self, line: str) -> list[tuple[str, str]]:
        m = self.pattern.search(line)
        if m and m.group(1) not in self.ids:
            self.ids.append(m.group(1))
        return [] if (m and self.swallow) else [(self.name, line)]


class Output:
    """Prefixed console output and one log file per source, shared by all readers."""

    def __init__(self, log_dir: str | None = None, stdout: IO[str] | None = None,
                 stderr: IO[str] | None = None):
        self.log_dir = log_dir
        self._out, self._err = stdout or sys.stdout, stderr or sys.stderr
        self._lock = threading.Lock()
        self._files: dict[str, IO[str]] = {}
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)

    def line(self, source: str, text: str, err: bool = False) -> None:
        with self._lock:
            stream = self._err if err else self._out
            try:
                stream.write(f"[{source}] {text}\n")
                stream.flush()
            except (OSError, ValueError):  # console gone (closed pipe): keep draining the children
                pass
            if self.log_dir:
                self._file(source).write(text + "\n")

    def raw(self, text: str) -> None:
        """An unprefixed line on stdout (--dry-run output)."""
        with self._lock:
            self._out.write(text + "\n")
            self._out.flush()

    def _file(self, source: str) -> IO[str]:
        f = self._files.get(source)
        if f is None:
            path = os.path.join(self.log_dir or ".", source.replace(" ", "-") + ".log")
            f = self._files[source] = open(path, "a", encoding="utf-8", buffering=1)
        return f

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()


class OutputHandler(logging.Handler):
    """Shows log records of an in-process component (the scheduler) as prefixed lines."""

    def __init__(self, output: Output, source: str):
        super().__init__()
        self.output, self.source = output, source

    def emit(self, record: logging.LogRecord) -> None:
        try:
            for text in self.format(record).splitlines():
                self.output.line(self.source, text, err=record.levelno >= logging.WARNING)
        except Exception:
            self.handleError(record)


def deliver(output: Output, on_exit: Callable[[str, int], None], source: str, text: str,
            err: bool) -> None:
    """Print a process line, or report the exit status it announces (EXIT_MARKER)."""
    status = text[len(EXIT_MARKER):].strip()
    if text.startswith(EXIT_MARKER) and status.isdigit():
        on_exit(source, int(status))
    else:
        output.line(source, text, err)
