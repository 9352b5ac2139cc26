"""docs/architecture.md is the code map: every package (and top-level module) under
market_pipeline/, every stage package under assets/ and every module of sensors/ is named there,
so a newcomer finds each one and a new one cannot be added off the map."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = ROOT / "market_pipeline"


def domain_parts() -> list[str]:
    """Each package as `name/` (subpackages as `parent/name/`), each top-level module as `name.py`,
    and the shipped data folder."""
    packages = sorted(
        str(init.parent.relative_to(DOMAIN)) + "/"
        for init in DOMAIN.rglob("__init__.py")
        if init.parent != DOMAIN and "__pycache__" not in init.parts
    )
    modules = sorted(p.name for p in DOMAIN.glob("*.py") if p.name != "__init__.py")
    return packages + modules + ["defaults/"]


def orchestration_parts() -> list[str]:
    """Each package under assets/ as `assets/name/`, each module of sensors/ as `sensors/name.py`."""
    packages = sorted(
        "assets/" + str(init.parent.relative_to(ROOT / "assets")) + "/"
        for init in (ROOT / "assets").rglob("__init__.py")
        if init.parent != ROOT / "assets" and "__pycache__" not in init.parts
    )
    modules = sorted("sensors/" + p.name for p in (ROOT / "sensors").glob("*.py") if p.name != "__init__.py")
    return packages + modules


def named_in_map(text: str) -> set[str]:
    """The names the map's code block lists, nested ones with their parents' path."""
    block = re.search(r"```\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no code block holding the map"
    named, stack = set(), []  # (indent, path) of the packages enclosing the current line
    for line in block.group(1).splitlines():
        match = re.match(r"(\s*)(\S+)", line)
        if not match or not (match.group(2).endswith("/") or match.group(2).endswith(".py")):
            continue
        indent, name = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "".join(p for _, p in stack if p != "market_pipeline/") + name
        named.add(path)
        if name.endswith("/"):
            stack.append((indent, name))
    return named


def test_every_domain_package_is_on_the_map() -> None:
    named = named_in_map((ROOT / "docs" / "architecture.md").read_text())
    missing = [part for part in domain_parts() if part not in named]
    assert missing == [], f"docs/architecture.md does not name: {missing}"


def test_every_stage_and_sensor_module_is_on_the_map() -> None:
    named = named_in_map((ROOT / "docs" / "architecture.md").read_text())
    parts = orchestration_parts()
    assert "assets/lib/" in parts and "sensors/definitions.py" in parts
    missing = [part for part in parts if part not in named]
    assert missing == [], f"docs/architecture.md does not name: {missing}"


def test_the_map_reader_sees_a_missing_package() -> None:
    text = "```\nmarket_pipeline/   the domain\n  config/   typed config\n    sub/   nested\n```\n"
    assert named_in_map(text) == {"market_pipeline/", "config/", "config/sub/"}
