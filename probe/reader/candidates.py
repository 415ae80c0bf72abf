"""The results files in a result directory, each with the start time lm-eval recorded in it.

Names only say which files are candidates; the order comes from inside them. lm-eval names
a file by local time (``datetime.now()``), so names from runs in different time zones sort
wrongly; inside, ``date`` is ``time.time()`` taken when ``simple_evaluate`` started, the
same clock everywhere. (Its ``start_time``/``end_time`` are ``perf_counter`` readings, which
mean nothing outside their process.)
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from probe.reader.documents import Unreadable, parse_json, recorded_time
from probe.reader.evidence import run_evidence
from probe.reader.files import list_directory, read_regular_file, resolve_inside

MAX_RESULTS_BYTES = 64 * 2**20  # real results files are well under 1 MiB
FILE_SYSTEMS_OWN = "lost+found"  # where fsck puts what it recovers: never lm-eval's results

_TIME = r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d{6})?"  # datetime.isoformat(), ':' as '-'
# lm-eval writes <output_path>/<model>/results_<time>.json, or <stem>_<time>.json next to an
# --output_path that ends in .json. InferenceX's _stage_lm_eval_artifacts moves each of them
# into its working directory as <name>_conc<N>.json, or <name>_conc<N>_<k>.json when taken.
_NAME = re.compile(rf".+_{_TIME}(?:_conc(?P<concurrency>[1-9]\d*)(?:_[1-9]\d*)?)?\.json", re.ASCII)
# When several files cannot be used, the reason names this many of them and counts the rest.
_NAMED_PROBLEMS = 3


@dataclass(frozen=True)
class Candidate:
    """A file that lm-eval or InferenceX may have written as results, or a directory that may
    hold some. Either ``reason`` says why it cannot be used, or ``started_at`` (lm-eval's
    ``date``) and ``results`` (its ``results`` object) are set, with ``evidence`` (the probe's
    entry, None when the run was not probed). ``concurrency`` is InferenceX's ``_conc<N>``
    from the name, None for lm-eval's own names."""

    path: Path
    concurrency: int | None = None
    started_at: float | None = None
    results: dict[str, Any] | None = None
    reason: str | None = None
    evidence: dict[str, Any] | None = None
    subtasks: dict[str, list[str]] | None = None  # lm-eval's group_subtasks: group -> its tasks
    model_name: str | None = None  # lm-eval's model_name (the model= of --model_args)
    # lm-eval's higher_is_better: task -> {metric: whether higher is better}, the metrics it computed
    directions: dict[str, dict[str, bool]] | None = None
    generate_tasks: frozenset[str] = frozenset()  # tasks whose configs say output_type generate_until
    superseded: frozenset[str] = frozenset()  # its tasks a newer file holds (read --newest): not shown
    split_groups: frozenset[str] = frozenset()  # its groups with a task a newer file holds (read --newest)
    samples: dict[str, int] = field(default_factory=dict)  # generations lm-eval scored, per task (n-samples)

    @property
    def run_id(self) -> str | None:
        """The probe's identity of the run that wrote this file; None when unprobed (or unread)."""
        value = (self.evidence or {}).get("run_id")
        return value if isinstance(value, str) else None

    @property
    def slot(self) -> tuple[str, int | None]:
        """Which series of runs the file belongs to: its directory (lm-eval's model directory)
        and InferenceX's concurrency. Re-runs into the same output path share a slot."""
        return str(self.path.parent), self.concurrency


def list_candidates(result_dir: Path | str, now: float | None = None) -> list[Candidate]:
    """Every results file in ``result_dir`` or one of its subdirectories, in path order.

    Each is read in full, or carries the reason it cannot be. Only names lm-eval or InferenceX
    writes count. A subdirectory that cannot be listed, or a link leading outside, is listed with
    its reason. A volume's ``lost+found`` is passed over. A file reached twice through links is
    listed once. ``now`` (default: the clock) bounds the recorded times. See docs/reading.md.
    """
    root = Path(result_dir)
    now = time.time() if now is None else now
    try:
        entries = list_directory(root)
    except Unreadable as error:
        return [Candidate(root, reason=f"{root}: {error}")]
    found: list[Candidate] = []
    seen: set[str] = set()
    for entry in entries:
        if entry.name == FILE_SYSTEMS_OWN and entry.is_dir(follow_symlinks=False):
            continue
        try:
            files = _files_in(root, entry)
        except Unreadable as error:
            found.append(Candidate(Path(entry.path), reason=f"{entry.path}: {error}"))
            continue
        for file in files:
            real = os.path.realpath(file)
            if real not in seen:
                seen.add(real)
                found.append(_read(root, file, now))
    return found


def newest(candidates: list[Candidate]) -> Candidate | None:
    """The candidate with the latest recorded start, None when there is none.

    When the newest cannot be told, the result is a Candidate whose ``reason`` says why. That
    happens when any candidate cannot be read, or two share the latest start. It never guesses.
    """
    problems = [c for c in candidates if c.reason is not None]
    if problems:
        named = "; ".join(c.reason or "" for c in problems[:_NAMED_PROBLEMS])
        more = len(problems) - _NAMED_PROBLEMS
        return replace(problems[0], reason=named + (f"; and {more} more" if more > 0 else ""))
    if not candidates:
        return None
    latest = max(c.started_at for c in candidates if c.started_at is not None)
    tied = [c for c in candidates if c.started_at == latest]
    if len(tied) > 1:
        paths = ", ".join(str(c.path) for c in tied)
        return Candidate(tied[0].path, reason=f"{paths} record the same start time ('date' {latest!r}): "
                         "which one is the newest cannot be told")  # fmt: skip
    return tied[0]


def _files_in(root: Path, entry: os.DirEntry[str]) -> list[Path]:
    # The entry itself when it is a file with a candidate's name; a directory's candidates.
    try:
        is_directory = entry.is_dir()  # follows a link: a linked model directory counts
    except OSError as error:
        raise Unreadable(f"cannot be examined ({error.strerror or error})") from None
    if not is_directory:
        return [Path(entry.path)] if _NAME.fullmatch(entry.name) else []
    resolve_inside(root, Path(entry.path))
    return [Path(e.path) for e in list_directory(Path(entry.path)) if _NAME.fullmatch(e.name)]


def _read(root: Path, path: Path, now: float) -> Candidate:
    match = _NAME.fullmatch(path.name)
    concurrency = int(match["concurrency"]) if match and match["concurrency"] else None
    try:
        document = parse_json(read_regular_file(root, path, MAX_RESULTS_BYTES))
        if not isinstance(document, dict) or not isinstance(document.get("results"), dict):
            raise Unreadable("no 'results' object")
        started = recorded_time(document.get("date"), now, "date")
        evidence = run_evidence(document)
        subtasks = _subtasks(document.get("group_subtasks"))
    except Unreadable as error:
        return Candidate(path, concurrency, reason=f"cannot read {path}: {error}")
    name = document.get("model_name") or _evidence_model(evidence)
    return Candidate(path, concurrency, started, document["results"], evidence=evidence, subtasks=subtasks,
                     model_name=name if isinstance(name, str) else None,
                     directions=_directions(document.get("higher_is_better")),
                     generate_tasks=_generate_tasks(document.get("configs")),
                     samples=_samples(document.get("n-samples"), document.get("configs")))  # fmt: skip


def _evidence_model(evidence: dict[str, Any] | None) -> str | None:
    """The one model the probe saw every generate request made for, else None.

    Used where lm-eval recorded no ``model_name`` (InferenceX's lm-eval records ``""``).
    """
    models = (evidence or {}).get("models")
    if isinstance(models, list) and len(models) == 1 and isinstance(models[0], str):
        return models[0]
    return None


def _directions(value: Any) -> dict[str, dict[str, bool]] | None:
    """lm-eval's ``higher_is_better`` (its metrics, per task), the entries it can be read from;
    None when the file has none (older writers)."""
    if not isinstance(value, dict):
        return None
    return {
        task: {metric: higher for metric, higher in metrics.items() if isinstance(higher, bool)}
        for task, metrics in value.items()
        if isinstance(metrics, dict)
    }


def _samples(value: Any, configs: Any) -> dict[str, int]:
    """How many generations lm-eval scored per task: its ``n-samples`` (``effective``: documents)
    times the task's ``repeats``."""
    if not isinstance(value, dict):
        return {}
    configs = configs if isinstance(configs, dict) else {}
    found = {}
    for task, n in value.items():
        documents = n.get("effective") if isinstance(n, dict) else None
        config = configs.get(task)
        repeats = config.get("repeats", 1) if isinstance(config, dict) else 1
        if type(documents) is int and type(repeats) is int and repeats >= 1:
            found[task] = documents * repeats
    return found


def _generate_tasks(configs: Any) -> frozenset[str]:
    """The tasks whose config lm-eval saved says they generate (``output_type: generate_until``)."""
    if not isinstance(configs, dict):
        return frozenset()
    return frozenset(t for t, c in configs.items() if isinstance(c, dict) and c.get("output_type") == "generate_until")


def _subtasks(value: Any) -> dict[str, list[str]]:
    """lm-eval's ``group_subtasks`` (a group's results row aggregates these tasks)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(tasks, list) and all(isinstance(t, str) for t in tasks) for tasks in value.values()
    ):
        raise Unreadable("'group_subtasks' is not an object of task lists")
    return {group: list(tasks) for group, tasks in value.items() if tasks}
