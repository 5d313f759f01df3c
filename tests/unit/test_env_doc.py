"""docs/env.md documents exactly the variables ps/config.py reads."""
import re
from pathlib import Path

from ps.config import VARIABLES

DOC = Path(__file__).resolve().parents[2] / "docs" / "env.md"


def test_env_doc_lists_exactly_the_config_variables():
    rows = re.findall(r"^\|\s*`([A-Z_]+)`\s*\|", DOC.read_text(), flags=re.M)
    assert sorted(rows) == sorted(v.name for v in VARIABLES)


def test_env_doc_defaults_match():
    text = DOC.read_text()
    for var in VARIABLES:
        row = re.search(rf"^\|\s*`{var.name}`\s*\|([^|]*)\|", text, flags=re.M)
        assert row, var.name
        default = row.group(1).strip().strip("`")
        expected = "—" if var.default is None else str(int(var.default)) if isinstance(var.default, bool) \
            else f"{var.default:g}" if isinstance(var.default, float) else str(var.default)
        assert default == expected, f"{var.name}: doc says {default!r}, code says {expected!r}"


def _plain(text: str) -> str:
    """A description as words: the page's links and code marks dropped, spaces collapsed; a
    bracket of links alone is the page's, one with words too is compared."""
    text = re.sub(r"\s*\((?:\[[^\]]*\]\([^)]*\)(?:[,;]\s*)?)+\)", "", text)   # "([page](url))", of links alone
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)               # [text](url) -> text
    return re.sub(r"\s+", " ", text.replace("`", "")).strip().rstrip(".").strip()


def test_env_doc_says_what_the_code_says_of_each_variable():
    """The page's description is config's doc, word for word, with only links and code marks
    added: one of them changed alone is a page (or a --help) that says something else."""
    text = DOC.read_text()
    for var in VARIABLES:
        row = re.search(rf"^\|\s*`{var.name}`\s*\|[^|]*\|[^|]*\|(.*)\|\s*$", text, flags=re.M)
        assert row, var.name
        assert _plain(row.group(1)) == _plain(var.doc), f"{var.name}:\n page: {_plain(row.group(1))}\n code: {_plain(var.doc)}"
