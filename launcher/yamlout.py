"""YAML for ``--launcher kubernetes --dry-run``: a small emitter for the objects it makes.

PyYAML is no dependency of ps, and the manifests use a small part of YAML: mappings,
sequences, strings, integers, booleans and null. Writing that part by hand takes a few dozen
lines, needs nothing installed, gives the same bytes everywhere, and reads like hand-written
YAML (a JSON fallback, also valid YAML, would not). A string is written plain only when no
YAML 1.1 or 1.2 reader can take it for anything else (a number, a boolean such as ``on``,
null, a time such as ``1:20``); otherwise it is double-quoted with every character outside
printable ASCII escaped. tests/launcher/test_kubernetes_yaml.py checks that any such value
reads back through ``yaml.safe_load_all`` as it was.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

_PLAIN = re.compile(r"[A-Za-z/][A-Za-z0-9_./-]*\Z")
_WORDS = frozenset({"y", "n", "yes", "no", "true", "false", "on", "off", "null"})   # YAML 1.1 and 1.2
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t"}
MAX_KEY = 1000     # characters of a key written as "key: value"; a longer one gets "? key"


def quote(text: str) -> str:
    """``text`` as a YAML double-quoted scalar, in printable ASCII."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value if _PLAIN.match(value) and value.lower() not in _WORDS else quote(value)
    if isinstance(value, (dict, list)) and not value:
        return "{}" if isinstance(value, dict) else "[]"
    raise TypeError(f"no YAML for {type(value).__name__} {value!r}")


def _nested(value: Any) -> bool:
    return isinstance(value, (dict, list)) and bool(value)


def block(value: Any, indent: int = 0) -> list[str]:
    """The lines of a non-empty mapping or sequence, ``indent`` spaces in."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"a mapping key must be a string, got {key!r}")
            name = scalar(key)
            if len(name) > MAX_KEY:              # past YAML's 1024 for an implicit key: "? key" / ": value"
                lines.append(f"{pad}? {name}")
                name = ""
            if _nested(item):
                lines.append(f"{pad}{name}:")
                lines += block(item, indent + 2)
            else:
                lines.append(f"{pad}{name}: {scalar(item)}")
        return lines
    for item in value:
        if isinstance(item, dict) and item:
            inner = block(item, indent + 2)
            lines += [f"{pad}- {inner[0][indent + 2:]}", *inner[1:]]
        elif _nested(item):
            lines += [f"{pad}-", *block(item, indent + 2)]
        else:
            lines.append(f"{pad}- {scalar(item)}")
    return lines


def dump_all(objects: Iterable[dict[str, Any]], header: Sequence[str] = ()) -> str:
    """Multi-document YAML: ``header`` as comment lines, then one ``---`` document per object."""
    lines = [f"# {part}".rstrip() for line in header for part in line.splitlines() or [""]]
    for obj in objects:
        lines.append("---")
        lines += block(obj) if obj else ["{}"]
    return "\n".join(lines) + "\n"
