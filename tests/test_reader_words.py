"""The words for a trip come from one function (probe.reader.words.trip_words): today's records
read as they always have; a record that names its cause is told by that cause."""

from __future__ import annotations

import pytest

from probe.reader.render import pathology_text
from probe.reader.words import trip_words

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

FOUND = {"pathology": "non_terminating", "observations": 16, "pathological": 16, "finish_reasons": {"length": 16},
         "max_tokens": [2048], "seconds_since_first_request": None, "short_circuited_requests": 3,
         "cancelled_in_flight": 0, "model": None, "lm_eval_version": None, "settings_fingerprint": None}  # fmt: skip


def test_a_record_without_a_cause_reads_as_before() -> None:
    words = trip_words(FOUND)
    assert (words.reason, words.cause) == ("generation pathology: non_terminating", "non-termination: cut short")
    assert "(non_terminating, the model does not stop). 16 of 16 generations it observed ended at the max_tokens " \
           "cap (2048) or by repetition" in pathology_text(FOUND)  # fmt: skip


def test_a_record_that_names_the_context_window_says_so() -> None:
    found = {**FOUND, "cause": "context_window"}
    assert trip_words(found).cause == "context window: cut short"
    text = pathology_text(found)
    assert "ran out of the server's context window" in text and "what to change:" in text and "max_model_len" in text
    assert "max_tokens cap" not in text and "does not stop" not in text


def test_requests_cancelled_in_flight_are_not_said_to_have_never_reached_the_server() -> None:
    # The short-circuited count includes those cancelled in flight (Probe.blanks): they did
    # reach it, so the sentence keeps them apart.
    text = pathology_text({**FOUND, "short_circuited_requests": 32, "cancelled_in_flight": 8})
    assert "24 requests were then answered with empty strings without contacting the server" in text
    assert "8 in-flight requests were cancelled" in text


def test_an_in_process_model_is_named_without_a_server_it_never_had() -> None:
    # lm-eval's in-process vLLM (and HF) backends record no base_url: the sidecar holds null.
    found = {**FOUND, "lm_eval_version": "0.4.13"}
    text = pathology_text({**found, "model": "/models/tiny", "base_url": None})
    assert "Model /models/tiny, lm-eval 0.4.13." in text and "at None" not in text
    served = pathology_text({**found, "model": "m", "base_url": "http://h:1/v1/completions"})
    assert "Model m at http://h:1/v1/completions, lm-eval 0.4.13." in served
