"""The pure logic of the probe: knobs, evidence labels, the trip rule, URL hygiene."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from probe.runtime.core import contract, evidence, rule, sidecar
from probe.runtime.hooking import versions

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent


@pytest.mark.parametrize(
    ("observed", "pathological", "fires"),
    [
        (15, 15, False),
        (16, 12, True),
        (16, 11, False),
        (16, 16, True),
        (100, 75, True),
        (100, 74, False),
        (0, 0, False),
    ],
)
def test_rule_needs_min_samples_and_ratio(observed: int, pathological: int, fires: bool) -> None:
    assert rule.rule_fires(observed, pathological, 16, 0.75) is fires


@pytest.mark.parametrize("ratio", [1e-12, 0.5, 0.75])
def test_zero_pathological_observations_never_trip(ratio: float) -> None:
    assert not rule.rule_fires(16, 0, 16, ratio)
    assert not rule.rule_fires(1000, 0, 1, ratio)


def test_a_healthy_model_is_not_tripped_by_a_tiny_ratio_knob() -> None:
    settings, warnings = contract.read_settings({contract.ENV_LENGTH_RATIO: "1e-12"})
    sample = rule.Sample(settings.min_samples, settings.length_ratio)
    for place in range(16):
        sample.join(place, 1)
        sample.record(place, 0, False)
    assert warnings and not sample.fires() and sample.complete


def test_rule_is_exact_at_ratios_that_round_badly() -> None:
    assert rule.rule_fires(10, 7, 1, 0.7)
    assert not rule.rule_fires(10, 6, 1, 0.7)


def _response(*reasons: object, usage: object = None) -> dict:
    response: dict = {"choices": [{"index": i, "text": "x", "finish_reason": r} for i, r in enumerate(reasons)]}
    if usage is not None:
        response["usage"] = usage
    return response


@pytest.mark.parametrize(
    ("response", "labels"),
    [
        (_response("length"), ["length"]),
        (_response("stop", "length", "repetition"), ["stop", "length", "repetition"]),
        (_response(None, usage={"completion_tokens": 2048}), ["usage_at_cap"]),
        (_response(None, usage={"completion_tokens": 10}), ["usage_below_cap"]),
        (_response(None, None, usage={"completion_tokens": 2048}), ["usage_below_cap", "usage_below_cap"]),
        (_response(None), []),
        (_response(None, usage={"completion_tokens": "2048"}), []),
        (_response(None, usage={"completion_tokens": True}), []),
        (_response(42), []),
        (_response(""), []),
        ({"choices": []}, []),
        ({"choices": "nonsense"}, []),
        ({"choices": [None, "x", 3]}, []),
        ({"error": "overloaded"}, []),
        ([], []),
        (None, []),
        ("length", []),
    ],
)
def test_classify_response(response: object, labels: list[str]) -> None:
    assert evidence.classify_response(response, 2048) == labels


def test_pathological_labels() -> None:
    assert [evidence.is_pathological(x) for x in ("length", "repetition", "usage_at_cap")] == [True] * 3
    assert [evidence.is_pathological(x) for x in ("stop", "usage_below_cap", "tool_calls")] == [False] * 3


def test_tally_counts_histogram_and_caps() -> None:
    tally = evidence.Tally()
    tally.add(["length", "length", "stop"], 2048)
    tally.add(["repetition"], 4096)
    tally.add([], 8192)  # a malformed response adds nothing, not even its cap
    summary = tally.as_dict()
    assert summary == {
        "observations": 4,
        "pathological": 3,
        "ratio": 0.75,
        "finish_reasons": {"length": 2, "repetition": 1, "stop": 1},
        "causes": dict.fromkeys(contract.CAUSES, 0),  # labels alone tell no cause
        "repetition": 1,
        "flagged": 0,
        "false_flags": 0,
        "max_tokens": [2048, 4096],
    }


def test_defaults_are_the_contract() -> None:
    settings, warnings = contract.read_settings({})
    assert warnings == []
    assert settings == contract.Settings(enabled=True, min_samples=16, length_ratio=0.75, min_max_tokens=1024)


@pytest.mark.parametrize("value", ["0", "false", "OFF", " off ", "no"])
def test_switch_off(value: str) -> None:
    assert contract.read_settings({contract.ENV_SWITCH: value})[0].enabled is False


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (contract.ENV_MIN_SAMPLES, "ten"),
        (contract.ENV_MIN_SAMPLES, "0"),
        (contract.ENV_MIN_SAMPLES, "-3"),
        (contract.ENV_MIN_SAMPLES, "1.5"),
        (contract.ENV_LENGTH_RATIO, "nan"),
        (contract.ENV_LENGTH_RATIO, "inf"),
        (contract.ENV_LENGTH_RATIO, "0"),
        (contract.ENV_LENGTH_RATIO, "1.5"),
        (contract.ENV_LENGTH_RATIO, "most"),
        (contract.ENV_LENGTH_RATIO, "1e-12"),
        (contract.ENV_LENGTH_RATIO, "0.49"),
        (contract.ENV_LENGTH_RATIO, "0.7_5"),
        (contract.ENV_MIN_SAMPLES, "١٦"),
        (contract.ENV_MIN_SAMPLES, "\uff11\uff16"),  # full-width digits
        (contract.ENV_MIN_SAMPLES, "1_6"),
        (contract.ENV_MIN_MAX_TOKENS, "\uff11\uff10\uff12\uff14"),
        (contract.ENV_MIN_MAX_TOKENS, "-1"),
        (contract.ENV_MIN_MAX_TOKENS, "lots"),
        (contract.ENV_SWITCH, "maybe"),
        (contract.ENV_SLOW_START, "sometimes"),
        (contract.ENV_SLOW_START, "64"),
        (contract.ENV_STREAM, "always"),
        (contract.ENV_STREAM, "2"),
        (contract.ENV_DETECTOR, "perhaps"),
        (contract.ENV_DETECTOR_NGRAM, "1"),
        (contract.ENV_DETECTOR_NGRAM, "eight"),
        (contract.ENV_DETECTOR_WINDOW, "8"),
        (contract.ENV_DETECTOR_WINDOW, "\uff12\uff15\uff16"),
        (contract.ENV_DETECTOR_DRIFT, "0"),
        (contract.ENV_DETECTOR_DRIFT, "1"),
        (contract.ENV_DETECTOR_DRIFT, "nan"),
        (contract.ENV_DETECTOR_THRESHOLD, "0.5"),
        (contract.ENV_DETECTOR_THRESHOLD, "inf"),
        (contract.ENV_DETECTOR_THRESHOLD, "-24"),
    ],
)
def test_bad_knob_warns_with_name_and_value_and_uses_default(name: str, value: str) -> None:
    settings, warnings = contract.read_settings({name: value})
    assert settings == contract.Settings()
    assert len(warnings) == 1
    assert name in warnings[0] and repr(value) in warnings[0]


@pytest.mark.parametrize(
    "name",
    [contract.ENV_MIN_SAMPLES, contract.ENV_MIN_MAX_TOKENS, contract.ENV_DETECTOR_NGRAM, contract.ENV_DETECTOR_WINDOW],
)
@pytest.mark.parametrize("limit", [None, 0], ids=["python-digit-limit", "no-digit-limit"])
@pytest.mark.parametrize("digits", [19, 5000])
def test_an_integer_knob_larger_than_any_setting_needs_warns_and_keeps_the_default(
    name: str, limit: int | None, digits: int
) -> None:
    # int() raised past Python's 4,300 digits, leaving the whole probe uninstalled; with the limit
    # lifted (PYTHONINTMAXSTRDIGITS=0) the number reached the results file, which a reader under
    # the limit then could not parse (hostile rounds 19 and 20). Leading zeros are no digits.
    before = sys.get_int_max_str_digits()
    if limit is not None:
        sys.set_int_max_str_digits(limit)
    try:
        settings, warnings = contract.read_settings({name: "9" * digits})
        padded, quiet = contract.read_settings({name: "0" * 40 + "64"})
    finally:
        sys.set_int_max_str_digits(before)
    assert settings == contract.Settings()
    assert len(warnings) == 1 and name in warnings[0] and f"{digits} digits" in warnings[0] and len(warnings[0]) < 300
    assert quiet == [] and padded.as_dict()[name] == 64


def test_good_knobs_are_used() -> None:
    settings, warnings = contract.read_settings(
        {contract.ENV_MIN_SAMPLES: "4", contract.ENV_LENGTH_RATIO: "0.5", contract.ENV_MIN_MAX_TOKENS: "0"}
    )
    assert warnings == []
    assert (settings.min_samples, settings.length_ratio, settings.min_max_tokens) == (4, 0.5, 0)


def test_fingerprint_follows_effective_values() -> None:
    default = contract.settings_fingerprint(contract.Settings())
    assert default == contract.settings_fingerprint(contract.read_settings({contract.ENV_LENGTH_RATIO: "nan"})[0])
    assert default != contract.settings_fingerprint(contract.Settings(length_ratio=0.8))
    assert default.startswith("sha256:") and len(default) == len("sha256:") + 16


@pytest.mark.parametrize(
    ("url", "public"),
    [
        ("http://user:sk-secret@host:8000/v1/completions?api_key=sk-2", "http://host:8000/v1/completions"),
        ("https://host/v1/chat/completions", "https://host/v1/chat/completions"),
        ("host:8000/v1", "host:8000/v1"),
        (None, None),
    ],
)
def test_public_url_drops_credentials(url: str | None, public: str | None) -> None:
    assert sidecar.public_url(url) == public


def test_sidecar_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert contract.sidecar_path({"RESULT_DIR": "/a", "EVAL_RESULT_DIR": "/b"}) == f"/a/{contract.SIDECAR_NAME}"
    assert contract.sidecar_path({"EVAL_RESULT_DIR": "/b"}) == f"/b/{contract.SIDECAR_NAME}"
    monkeypatch.chdir(tmp_path)
    assert contract.sidecar_path({"RESULT_DIR": ""}) == str(tmp_path / contract.SIDECAR_NAME)


@pytest.mark.parametrize(
    ("found", "warned"),
    [
        ("0.4.9.2", False),
        ("0.4.9.1", True),
        ("0.4.12", False),
        ("0.4.13.dev0", False),
        ("0.4.13", False),
        ("0.4.8", True),
        ("0.5.0", True),
        ("1.0", True),
    ],
)
def test_untested_lm_eval_releases_are_warned_about(found: str, warned: bool) -> None:
    warning = versions.LM_EVAL.warning(found)
    assert (warning is not None) is warned
    if warned:
        assert found in warning and "the releases 0.4.9.2 to 0.4.13" in warning and "(b315ef3)" in warning


def _sglang(reason: object, tokens: object = 2048, text: str = " and") -> dict:
    return {"text": text, "meta_info": {"finish_reason": reason, "completion_tokens": tokens}}


@pytest.mark.parametrize(
    ("response", "expected"),
    [(_sglang({"type": "length", "length": 2048}), [(0, "length", contract.OUTPUT_CAP)]),
     (_sglang({"type": "stop", "matched": 2}, 3, " 4"), [(0, "stop", None)]),
     (_sglang({"type": "abort", "message": "x"}, 5), [(0, "abort", contract.ABORTED)]),
     (_sglang({"type": "length"}, 100), [(0, "length", contract.CONTEXT_WINDOW)]),
     ([_sglang({"type": "stop"}, 3), _sglang({"type": "length"})], [(0, "stop", None), (1, "length", "output_cap")]),
     ([{"text": "no meta_info"}, _sglang({"type": "length"})], [(1, "length", contract.OUTPUT_CAP)]),
     ([_sglang({"type": "length"}), "not an output"], [(0, "length", contract.OUTPUT_CAP)]),
     # OpenAI's choices are read whatever a proxy adds beside them (a meta_info once hid them).
     ({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}], "usage": {"completion_tokens": 2048},
       "meta_info": {}}, [(0, "length", contract.OUTPUT_CAP)]),
     # ... and a null or empty choices beside an SGLang output is no OpenAI answer.
     ({**_sglang({"type": "length"}), "choices": None}, [(0, "length", contract.OUTPUT_CAP)]),
     ({**_sglang({"type": "length"}), "choices": []}, [(0, "length", contract.OUTPUT_CAP)]),
     ({"error": {"message": "busy"}}, []), ([], [])],
    ids=["length", "stop", "abort", "window", "batch", "one-without-meta", "one-not-a-dict", "openai-with-meta",
         "sglang-null-choices", "sglang-empty-choices", "error", "empty-list"],
)  # fmt: skip
def test_sglang_native_outputs_are_read_each_by_its_meta_info(response: object, expected: list) -> None:
    found = evidence.describe_choices(response, 2048)
    assert [(c.index, c.label, c.cause) for c in found] == expected
