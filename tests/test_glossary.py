"""One name per concept (docs/glossary.md): the names the glossary retired appear nowhere in the
code, the messages or the documentation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parents[1]
# A retired name, and the name that replaced it.
RETIRED = {
    r"ShortCircuitAnswer|ShortCircuitedResponse": "BlankAnswer, BlankResponse",
    r"made[- ]up answer": "blank answer",
    r"slow start'?s? budget|budget of the slow start": "the slow start's allowance",
}


def sources() -> list[Path]:
    found = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for package in ("probe", "patcher"):
        found += (ROOT / package).rglob("*.py")
    return found


@pytest.mark.parametrize("retired", sorted(RETIRED))
def test_a_retired_name_is_used_nowhere(retired: str) -> None:
    pattern = re.compile(retired, re.IGNORECASE)
    uses = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sources()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert uses == [], f"use {RETIRED[retired]!r} instead: {uses}"
