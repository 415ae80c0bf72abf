"""The reader's promises as properties (hypothesis): a group never better than its worst task,
and no tripped run hidden by another."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.resultfiles import STARTED, figures, write_results, write_run, write_sidecar

from probe.reader.model import Status
from probe.reader.verdict import classify_all
from probe.runtime.core import contract

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

# A task's evidence and score, and what the evidence alone says of it.
LEAVES = {
    "healthy": (0.9, figures(), Status.OK),
    "under-floor": (0.0, figures(), Status.OK),  # a score under the floor says nothing of the group's
    "capped": (0.9, figures(cut_off=10, causes={"output_cap": 10}, finish_reasons={"length": 10, "stop": 30}),
               Status.BELOW_FLOOR),  # with --cap-rate-fails
    "no-score": (math.nan, figures(), Status.UNAVAILABLE),
}  # fmt: skip


@st.composite
def group_trees(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Leaf tasks of random kinds and groups over them (a group may contain earlier groups)."""
    leaves = {f"t{i}": draw(st.sampled_from(sorted(LEAVES))) for i in range(draw(st.integers(1, 6)))}
    groups: dict[str, list[str]] = {}
    for g in range(draw(st.integers(1, 4))):
        names = sorted(leaves) + sorted(groups)
        groups[f"g{g}"] = draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True))
    return leaves, groups


def _members(group: str, groups: dict[str, list[str]]) -> set[str]:
    found, pending = set(), list(groups[group])
    while pending:
        name = pending.pop()
        if name not in found:
            found.add(name)
            pending += groups.get(name, [])
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(group_trees())
def test_a_group_is_never_better_than_the_evidence_of_any_task_in_it(tree: tuple[dict, dict[str, list[str]]]) -> None:
    leaves, groups = tree
    scores = {name: LEAVES[kind][0] for name, kind in leaves.items()} | {g: 0.9 for g in groups}
    with tempfile.TemporaryDirectory() as directory:
        path = write_run(Path(directory), {}, {name: LEAVES[kind][1] for name, kind in leaves.items()},
                         group_subtasks=groups)  # fmt: skip
        document = json.loads(path.read_text())
        document["results"] = {n: {"exact_match,strict-match": s} for n, s in scores.items()}
        path.write_text(json.dumps(document))
        verdicts = {v.task: v for v in classify_all(directory, 0.5, cap_rate_fails=True)}
    for group in groups:
        tasks = [t for t in _members(group, groups) if t in leaves]
        bound = Status.worst(LEAVES[leaves[t]][2] for t in tasks)
        assert verdicts[group].status.severity <= bound.severity, (group, groups, leaves, verdicts[group].reason)
        if any(leaves[t] == "capped" for t in tasks):  # caveats included
            assert verdicts[group].caveat is not None, (group, groups, leaves)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.sampled_from(["a", "b"])), min_size=1, max_size=5))
def test_no_tripped_run_is_hidden_by_another(runs: list[tuple[bool, bool, str]]) -> None:
    """Runs of models a and b, each tripped or not, each with its results file or without
    (killed): the directory is below_floor exactly when one of them tripped."""
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        for i, (tripped, wrote_results, model) in enumerate(runs):
            run_id, started = f"{i:032x}.{i + 1}", STARTED + 100 * i
            task = figures(tripped=tripped, short_circuited=24 if tripped else 0)
            if wrote_results or not tripped:
                write_run(root, {"gsm8k": 0.9}, {"gsm8k": task}, tripped=tripped, run_id=run_id, subdir=model,
                          name=f"results_2026-11-30T01-00-0{i}.000000.json", date=started)  # fmt: skip
            if tripped:  # each trip moves the previous record aside, as the runtime does
                sidecar = root / contract.SIDECAR_NAME
                if sidecar.exists():
                    sidecar.rename(root / f"{contract.SIDECAR_NAME}.stale-{i}")
                write_sidecar(root, tripped_at=started + 30, record={"run_id": run_id, "tasks": ["gsm8k"]})
        status = Status.worst(v.status for v in classify_all(root, 0.5))
    assert status is (Status.BELOW_FLOOR if any(t for t, _, _ in runs) else Status.OK), runs


RUN = st.tuples(st.sampled_from(["m-a", "m-b", None]), st.booleans(), st.booleans())  # model, probed, killed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(RUN, min_size=1, max_size=5), st.booleans())
def test_a_verdict_rests_only_on_its_own_runs_trip_and_no_trip_is_lost(runs: list[tuple], flat: bool) -> None:
    """Runs of several models into one directory (lm-eval's model directories, or flat as
    InferenceX writes them), probed or not; each probed run of model m-a trips, and some are
    killed before they write results. Every trip record is shown (on its run's row, or as a row
    of its own), and a row cut short by a trip record is that record's run: the same run
    identity, or, for results without one, the same model."""
    with tempfile.TemporaryDirectory() as directory:
        root, records = Path(directory), []
        for i, (model, probed, killed) in enumerate(runs):
            run_id, started = f"{i:032x}.{i + 1}", STARTED + 100 * i
            tripped = probed and model == "m-a"
            name, where = f"results_2026-11-30T01-00-0{i}.000000.json", None if flat else (model or "unnamed")
            extra = {"model_name": model} if model else {}
            if not (tripped and killed):
                if probed:
                    task = figures(tripped=tripped, short_circuited=24 if tripped else 0)
                    write_run(root, {"gsm8k": 0.9}, {"gsm8k": task}, tripped=tripped, run_id=run_id, subdir=where,
                              name=name, date=started, **extra)  # fmt: skip
                else:
                    write_results(root, 0.9, name=name, subdir=where, date=started, **extra)
            if tripped:  # each trip moves the previous record aside, as the runtime does
                sidecar = root / contract.SIDECAR_NAME
                if sidecar.exists():
                    sidecar.rename(root / f"{contract.SIDECAR_NAME}.stale-{i}")
                    records[-1] = root / f"{contract.SIDECAR_NAME}.stale-{i}"
                record = {"run_id": run_id, "tasks": ["gsm8k"], "model": model}
                write_sidecar(root, tripped_at=started + 30, record=record)
                records.append(sidecar)
        verdicts = classify_all(root, 0.5)
        shown = {v.source.trip_record for v in verdicts if v.source.trip_record is not None}
        assert {r.resolve() for r in records} <= {Path(p).resolve() for p in shown}, (runs, flat)
        for v in verdicts:
            if v.source.results_file is None or v.source.trip_record is None or v.pathology is None:
                continue
            trip = json.loads(Path(v.source.trip_record).read_text())["verdict"]
            document = json.loads(Path(v.source.results_file).read_text())
            own = (document.get(contract.EVIDENCE_KEY) or {}).get("run_id")
            assert trip["run_id"] == own or (own is None and trip["model"] == document.get("model_name")), (runs, flat)
