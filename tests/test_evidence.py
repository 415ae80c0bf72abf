"""The pure logic of the probe: knobs, evidence labels, the trip rule, URL hygiene."""

from __future__ import annotations

from pathlib import Path

import pytest

from probe import body


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
    assert body.rule_fires(observed, pathological, 16, 0.75) is fires


def test_rule_is_exact_at_ratios_that_round_badly() -> None:
    assert body.rule_fires(10, 7, 1, 0.7)
    assert not body.rule_fires(10, 6, 1, 0.7)


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
    assert body.classify_response(response, 2048) == labels


def test_pathological_labels() -> None:
    assert [body.is_pathological(x) for x in ("length", "repetition", "usage_at_cap")] == [True] * 3
    assert [body.is_pathological(x) for x in ("stop", "usage_below_cap", "tool_calls")] == [False] * 3


def test_tally_counts_histogram_and_caps() -> None:
    tally = body.Tally()
    tally.add(["length", "length", "stop"], 2048)
    tally.add(["repetition"], 4096)
    tally.add([], 8192)  # a malformed response adds nothing, not even its cap
    summary = tally.as_dict()
    assert summary == {
        "observations": 4,
        "pathological": 3,
        "ratio": 0.75,
        "finish_reasons": {"length": 2, "repetition": 1, "stop": 1},
        "repetition": 1,
        "max_tokens": [2048, 4096],
    }


def test_defaults_are_the_contract() -> None:
    settings, warnings = body.read_settings({})
    assert warnings == []
    assert settings == body.Settings(enabled=True, min_samples=16, length_ratio=0.75, min_max_tokens=1024)


@pytest.mark.parametrize("value", ["0", "false", "OFF", " off ", "no"])
def test_switch_off(value: str) -> None:
    assert body.read_settings({body.ENV_SWITCH: value})[0].enabled is False


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (body.ENV_MIN_SAMPLES, "ten"),
        (body.ENV_MIN_SAMPLES, "0"),
        (body.ENV_MIN_SAMPLES, "-3"),
        (body.ENV_MIN_SAMPLES, "1.5"),
        (body.ENV_LENGTH_RATIO, "nan"),
        (body.ENV_LENGTH_RATIO, "inf"),
        (body.ENV_LENGTH_RATIO, "0"),
        (body.ENV_LENGTH_RATIO, "1.5"),
        (body.ENV_LENGTH_RATIO, "most"),
        (body.ENV_MIN_MAX_TOKENS, "-1"),
        (body.ENV_MIN_MAX_TOKENS, "lots"),
        (body.ENV_SWITCH, "maybe"),
    ],
)
def test_bad_knob_warns_with_name_and_value_and_uses_default(name: str, value: str) -> None:
    settings, warnings = body.read_settings({name: value})
    assert settings == body.Settings()
    assert len(warnings) == 1
    assert name in warnings[0] and repr(value) in warnings[0]


def test_good_knobs_are_used() -> None:
    settings, warnings = body.read_settings(
        {body.ENV_MIN_SAMPLES: "4", body.ENV_LENGTH_RATIO: "0.5", body.ENV_MIN_MAX_TOKENS: "0"}
    )
    assert warnings == []
    assert (settings.min_samples, settings.length_ratio, settings.min_max_tokens) == (4, 0.5, 0)


def test_fingerprint_follows_effective_values() -> None:
    default = body.settings_fingerprint(body.Settings())
    assert default == body.settings_fingerprint(body.read_settings({body.ENV_LENGTH_RATIO: "nan"})[0])
    assert default != body.settings_fingerprint(body.Settings(length_ratio=0.8))
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
    assert body.public_url(url) == public


def test_sidecar_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert body.sidecar_path({"RESULT_DIR": "/a", "EVAL_RESULT_DIR": "/b"}) == f"/a/{body.SIDECAR_NAME}"
    assert body.sidecar_path({"EVAL_RESULT_DIR": "/b"}) == f"/b/{body.SIDECAR_NAME}"
    monkeypatch.chdir(tmp_path)
    assert body.sidecar_path({"RESULT_DIR": ""}) == str(tmp_path / body.SIDECAR_NAME)
