"""launcher/yamlout.py: what it writes reads back through PyYAML exactly as it was: the
manifests, the strings YAML would take for something else, and any value of the subset."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher import kubernetes as k8s
from launcher.kubejob import manifests_text
from launcher.launch import parse_args
from launcher.yamlout import dump_all, scalar

yaml = pytest.importorskip("yaml")

TRICKY = ["yes", "No", "ON", "off", "y", "N", "true", "False", "null", "Null", "~", "", " lead", "trail ",
          "1:20", "0400", "0x1f", "1e3", ".inf", "-.nan", "-m", "- x", "a: b", "a #b", "#x", "&a", "*a", "!t",
          "%x", "@x", "`x", "|", ">", "{}", "[]", "?", "'q'", '"d"', "back\\slash", "tab\tx", "line\nbreak",
          "\x00", "\x7f", "\x85", "\u2028", "\ufeff", "\U0001F600", "é", "2026-01-01", "12:30:00", "=",
          "<<", "python:3.11", "/var/run/ps", "metadata.annotations['x']", "nvidia.com/gpu"]


def test_strings_yaml_would_misread_read_back_as_strings():
    docs = list(yaml.safe_load_all(dump_all([{"values": TRICKY, **{t: t for t in TRICKY}}])))
    assert docs == [{"values": TRICKY, **{t: t for t in TRICKY}}]


def test_a_key_longer_than_yaml_allows_inline_is_written_explicitly():
    objects = [{"k" * 1500: 1, "é" * 300: {"a": [1]}, "list": [{"x" * 1200: None, "b": 2}]}]
    assert list(yaml.safe_load_all(dump_all(objects))) == objects


def test_plain_only_where_nothing_else_is_meant():
    assert scalar("python") == "python" and scalar("/var/run/ps") == "/var/run/ps"
    assert scalar("yes") == '"yes"' and scalar("1:20") == '"1:20"' and scalar("-m") == '"-m"'
    assert scalar(256) == "256" and scalar(True) == "true" and scalar(None) == "null"
    assert scalar({}) == "{}" and scalar([]) == "[]"
    with pytest.raises(TypeError, match="no YAML for float"):
        scalar(1.5)


def test_the_manifests_round_trip_exactly():
    for argv, version in ((["-n", "2", "-s", "2", "--max-restarts", "2"], None),
                          (["-n", "1", "--no-auth", "--env", "X:a: b # c"], (1, 27))):
        spec = parse_args(["--launcher", "kubernetes", "--image", "python:3.11", *argv, "python", "t.py"], {})
        job = k8s.plan(spec, "default", k8s.Features(version), k8s.secret_files(spec, {}))
        text = manifests_text(job)
        assert text.startswith("# ps job ") and text.count("\n---\n") == len(k8s.manifests(job))
        assert list(yaml.safe_load_all(text)) == k8s.manifests(job)


values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.dictionaries(st.text(), values, max_size=5), min_size=1, max_size=3))
def test_any_value_of_the_subset_round_trips(objects):
    assert list(yaml.safe_load_all(dump_all(objects))) == objects
