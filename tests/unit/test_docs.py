"""README.md, docker/README.md and docs/: the settings reference matches the code, and every relative link lands."""

from __future__ import annotations

import re
from pathlib import Path

from tests.settings_scan import kdiv_literal_defaults, kdiv_variables_read_by_the_code

REPO = Path(__file__).resolve().parents[2]
SETTINGS = REPO / "docs" / "settings.md"
PAGES = [REPO / "README.md", REPO / "docker" / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_ROW = re.compile(r"^\|\s*`(KDIV_[A-Z0-9_]+)`\s*\|([^|]*)\|")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def settings_table() -> dict[str, str]:
    """docs/settings.md's table: each setting's name and its default cell, as written."""
    rows: dict[str, str] = {}
    for line in SETTINGS.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            name, default = match.groups()
            assert name not in rows, f"docs/settings.md lists {name} twice"
            rows[name] = default.strip()
    return rows


def test_the_settings_table_lists_exactly_the_settings_the_code_reads():
    listed = set(settings_table())
    read = kdiv_variables_read_by_the_code()
    assert sorted(read - listed) == [], "settings the code reads that docs/settings.md does not list"
    assert sorted(listed - read) == [], "settings docs/settings.md lists that no code reads"


def _written_default(cell: str) -> str | None:
    """The default's literal: the cell's first `code` span (prose around it is explanation)."""
    match = re.match(r"`([^`]*)`", cell)
    return match.group(1) if match else None


def test_each_default_in_the_settings_table_is_the_code_s():
    table = settings_table()
    defaults = kdiv_literal_defaults()
    assert {"KDIV_BOOTSTRAP", "KDIV_BATCH_MAX", "KDIV_WEB_ENABLED", "KDIV_TRACE_GRACE_S"} <= defaults.keys()
    wrong = []
    for name, value in sorted(defaults.items()):
        written = _written_default(table.get(name, ""))
        if isinstance(value, bool):
            ok = written == str(value).lower()
        elif isinstance(value, (int, float)):
            ok = written is not None and float(written) == float(value)
        elif value == "":
            # No default of its own: nothing, or one derived from another setting (`<app id>-...`).
            ok = written is None or "<" in written
        else:
            ok = written == value
        if not ok:
            wrong.append(f"{name}: docs/settings.md says {table.get(name)!r}, the code {value!r}")
    assert wrong == []


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings."""
    anchors = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_relative_link_in_the_readme_and_docs_lands():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in _LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_ci_runs_the_readmes_two_commands_test_command_last():
    """The README opens with the dev stack's command and the tests' command; CI runs the
    latter as its last step, as written."""
    blocks = re.findall(r"```sh\n(.*?)\n```", (REPO / "README.md").read_text(), re.DOTALL)
    stack, tests = blocks[:2]
    assert "honcho start" in stack
    ci_steps = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci_steps[-1] == tests.strip()
    assert (REPO / tests.split()[0]).is_file()
