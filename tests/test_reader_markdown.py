"""`eval-probe read DIR --format markdown`: a table a CI workflow appends to $GITHUB_STEP_SUMMARY,
checked by rendering it with a real Markdown library (markdown-it-py, GitHub's table syntax)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from support.procs import PYTHON
from support.resultfiles import STARTED, figures, write_run, write_sidecar

from probe import exitcodes

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

RUN = "c" * 32 + ".3"
HEADINGS = ["task", "metric", "score", "status", "cap rate", "cause", "results"]


def rendered_tables(text: str) -> list[list[list[str]]]:
    """Every table in ``text`` as rendered: rows of cell texts, the heading row first."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    tables: list[list[list[str]]] = []
    row: list[str] = []
    for token in tokens:
        if token.type == "table_open":
            tables.append([])
        elif token.type == "tr_open":
            row = []
        elif token.type == "inline" and tables and token.map is not None and _in_cell(tokens, token):
            row.append(
                "".join(child.content for child in token.children or [] if child.type in ("text", "code_inline"))
            )
        elif token.type == "tr_close":
            tables[-1].append(row)
    return tables


def _in_cell(tokens: list, token: object) -> bool:
    index = tokens.index(token)
    return index > 0 and tokens[index - 1].type in ("th_open", "td_open")


def markdown(directory: Path, *args: str) -> subprocess.CompletedProcess:
    command = [PYTHON, "-m", "probe", "read", str(directory), "--format", "markdown", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_the_markdown_table_shows_each_task_with_its_status_cause_and_evidence(tmp_path: Path) -> None:
    cut = figures(cut_off=16, causes={"output_cap": 16}, finish_reasons={"length": 16}, observations=16,
                  short_circuited=24, tripped=True)  # fmt: skip
    capped = figures(cut_off=10, causes={"context_window": 10}, finish_reasons={"length": 10, "stop": 30})
    path = write_run(tmp_path, {"sick": 0.0, "capped": 0.7}, {"sick": cut, "capped": capped}, tripped=True, run_id=RUN)
    write_sidecar(tmp_path, tripped_at=STARTED + 30, record={"run_id": RUN, "tasks": ["sick"], "model": "m"})
    run = markdown(tmp_path)
    assert run.returncode == exitcodes.READ_STATUS["below_floor"], run.stderr[-2000:]
    (table,) = rendered_tables(run.stdout)
    assert table[0] == HEADINGS
    rows = {row[0]: row for row in table[1:]}
    assert rows["sick"][1:6] == ["exact_match,strict-match", "0", "below_floor", "100.0%", "non-termination: cut short"]
    assert rows["capped"][1:6] == ["exact_match,strict-match", "0.7", "ok", "25.0%", "cut off: 10 context window"]
    assert all(str(path) in row[6] and RUN in row[6] for row in table[1:])
    html = MarkdownIt("commonmark").enable("table").render(run.stdout)
    assert "Evidence" in html and "16 of 16 generations it observed" in html
    assert "eval-probe read: below_floor" in html


def test_a_hostile_task_name_cannot_add_a_cell_a_row_or_markup(tmp_path: Path) -> None:
    forged = "x | ok | 1 |\n| well <script>alert(1)</script> **bold**"
    write_run(tmp_path, {forged: 0.0}, {})
    run = markdown(tmp_path)
    (table,) = rendered_tables(run.stdout)
    assert len(table) == 2 and all(len(row) == len(HEADINGS) for row in table)
    assert table[1][0] == forged.replace("\n", "\\n") and table[1][3] == "below_floor"
    html = MarkdownIt("commonmark").enable("table").render(run.stdout)
    assert "<script>" not in html and "<strong>bold</strong>" not in html
