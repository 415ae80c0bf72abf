"""One definition of a valid sidecar: the runtime (which moves another run's record aside or
follows its own) and the reader (which judges a run by it) accept exactly the same documents."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.resultfiles import STARTED

from probe.reader.sidecar import read_sidecar
from probe.runtime.core import contract
from probe.runtime.core.sidecar import read_sidecar_at

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([10**400, -(10**400)])
    | st.floats()
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
VALID = {
    "schema_version": 1,
    "verdict": {"tripped": True, "pathology": "non_terminating", "observations": 16, "pathological": 16,
                "finish_reasons": {"length": 4}, "max_tokens": [2048], "settings": {}, "tripped_at": STARTED,
                "cause": "repetition", "flagged": 12},
    "final": None,
}  # fmt: skip


@st.composite
def sidecars(draw: st.DrawFn) -> object:
    """A valid sidecar with some of its fields replaced by arbitrary JSON values, or dropped."""
    document = json.loads(json.dumps(VALID))
    if draw(st.booleans()):
        document["schema_version"] = draw(st.sampled_from([1, True, 1.0, "1", 2, None]))
    for name in draw(st.lists(st.sampled_from(sorted(VALID["verdict"])), max_size=3, unique=True)):
        if draw(st.booleans()):
            del document["verdict"][name]
        else:
            document["verdict"][name] = draw(JSON_VALUES)
    if draw(st.booleans()):
        document["final"] = draw(JSON_VALUES)
    return draw(st.sampled_from([document, document["verdict"], [document]])) if draw(st.booleans()) else document


def test_the_issues_example_is_refused_by_both() -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / contract.SIDECAR_NAME
        path.write_text(json.dumps({"schema_version": True, "verdict": {"tripped_at": 1.0}}))
        assert read_sidecar_at(str(path))[0] is None
        assert read_sidecar(directory).state == "unreadable"


@pytest.mark.parametrize(
    ("fields", "valid"),
    [
        ({}, True),
        ({"flagged": 0}, True),
        ({"flagged": 16}, True),
        ({"flagged": 17}, False),  # more flagged than pathological observations
        ({"flagged": -1}, False),
        ({"flagged": True}, False),
        ({"flagged": 3.0}, False),
        ({"flagged": None}, False),
        ({"cause": None}, True),
        ({"cause": "repetition"}, True),
        ({"cause": "a cause of the future"}, True),  # read in neutral words, never refused
        ({"cause": 3}, False),
    ],
)
def test_the_loop_detectors_fields_are_checked_when_present(fields: dict, valid: bool) -> None:
    document = json.loads(json.dumps(VALID))
    for name in ("cause", "flagged"):
        del document["verdict"][name]
    document["verdict"].update(fields)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / contract.SIDECAR_NAME
        path.write_text(json.dumps(document))
        assert (read_sidecar_at(str(path))[0] is not None) is valid
        assert (read_sidecar(directory, now=1e300).state == "valid") is valid


@pytest.mark.parametrize(
    ("record", "final", "valid"),
    [
        ({}, {}, True),
        ({"pathological": 900}, {}, False),  # more pathological than observed (hostile round 19)
        ({"pathological": -1, "observations": -1}, {}, False),
        ({"finish_reasons": {"length": 17}}, {}, False),  # more endings than observations
        ({"finish_reasons": {"length": 8}}, {}, True),  # the other 8 flagged before they ended
        ({"finish_reasons": {"length": -1}}, {}, False),
        ({"finish_reasons": {"length": "16"}}, {}, False),
        ({}, {"short_circuited_requests": 10, "cancelled_in_flight": 40}, False),
        ({}, {"short_circuited_requests": -1}, False),
        ({}, {"short_circuited_requests": "1303"}, False),
        ({}, {"cancelled_in_flight": None}, False),
        ({}, {"short_circuited_requests": 0, "cancelled_in_flight": 0}, True),
        # At most 18 digits, as a knob's (hostile round 26: sums of counts past a float's range).
        ({"observations": 10**18 - 1, "pathological": 10**18 - 1}, {}, True),
        ({"observations": 10**18, "pathological": 10**18}, {}, False),
        ({}, {"short_circuited_requests": 10**400}, False),
    ],
)
def test_counts_no_run_can_write_are_refused(record: dict, final: dict, valid: bool) -> None:
    document = json.loads(json.dumps(VALID))
    document["verdict"].update(record)
    document["final"] = {**(document.get("final") or {}), **final}
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / contract.SIDECAR_NAME
        path.write_text(json.dumps(document))
        assert (read_sidecar_at(str(path))[0] is not None) is valid
        assert (read_sidecar(directory, now=1e300).state == "valid") is valid


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sidecars())
def test_the_runtime_and_the_reader_agree_on_what_a_valid_sidecar_is(document: object) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / contract.SIDECAR_NAME
        path.write_text(json.dumps(document))  # NaN and Infinity are written as such
        runtime_accepts = read_sidecar_at(str(path))[0] is not None
        # The reader alone also refuses a trip from the future: judged at a far later "now" here.
        assert runtime_accepts == (read_sidecar(directory, now=1e300).state == "valid"), document
