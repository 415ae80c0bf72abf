"""The loop detector (probe/runtime/core/degeneration.py): its promises, as properties."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.runtime.core.contract import Settings
from probe.runtime.core.degeneration import CERTAIN_UNITS, UNIT_CHARS, LoopDetector

# Pure: does not depend on the lm-eval release; run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

DEFAULTS = Settings()
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=9)
SEPARATORS = st.sampled_from([" ", "\n", ", ", ". ", " = ", " | ", "  "])


def detector(**overrides: float) -> LoopDetector:
    knobs = {
        "ngram": DEFAULTS.detector_ngram, "window": DEFAULTS.detector_window,
        "drift": DEFAULTS.detector_drift, "threshold": DEFAULTS.detector_threshold, **overrides,
    }  # fmt: skip
    return LoopDetector(**knobs)  # type: ignore[arg-type]


def fed(text: str, cuts: list[int], **overrides: float) -> LoopDetector:
    """A detector fed ``text`` cut at ``cuts`` (positions), in order."""
    found = detector(**overrides)
    start = 0
    for cut in [*sorted({c % (len(text) + 1) for c in cuts}), len(text)]:
        found.feed(text[start:cut])
        start = cut
    return found


def prose(seed: int, n_words: int) -> str:
    """Words drawn at random from a large vocabulary: text that never loops."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou") for _ in range(3)) for _ in range(3000)
    ]
    return " ".join(rng.choice(vocabulary) for _ in range(n_words))


def cycle_text(words: list[str], separators: list[str], repeats: int) -> str:
    """``words`` joined by ``separators`` (in turn), the whole repeated ``repeats`` times."""
    one = "".join(w + separators[i % len(separators)] for i, w in enumerate(words))
    return one * repeats


def units_of(text: str) -> int:
    """How many units the detector makes of ``text`` (the piece it holds back excluded)."""
    found = LoopDetector(ngram=1, window=16, drift=0.5, threshold=1e9)
    found.feed(text)
    return found.units


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(WORDS, SEPARATORS), min_size=1, max_size=400), st.lists(st.integers(0, 10**6), max_size=40))
def test_the_verdict_and_where_it_came_do_not_depend_on_how_the_text_was_cut(pieces, cuts) -> None:
    # Loops and near-loops made of the drawn pieces, so that both outcomes are exercised.
    text = "".join(w + s for w, s in pieces) * (1 + 600 // max(1, len(pieces)))
    whole, cut = fed(text, []), fed(text, cuts)
    assert (cut.flagged_at, cut.units if not cut.flagged else None) == (
        whole.flagged_at,
        whole.units if not whole.flagged else None,
    )


@settings(max_examples=150, deadline=None)
@given(
    n_words=st.integers(1, 120),
    seed=st.integers(0, 10**6),
    lead=st.integers(0, 400),
    separators=st.lists(SEPARATORS, min_size=1, max_size=3),
)
def test_an_exact_cycle_is_flagged_within_its_documented_bound(n_words, seed, lead, separators) -> None:
    # A cycle of up to ``window`` units after ``lead`` words of healthy text: whatever came
    # before, the flag comes at most flag_bound(period) units after the cycle starts.
    rng = random.Random(seed)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 9))) for _ in range(n_words)
    ]
    one_cycle = cycle_text(words, separators, 1)
    period = units_of(one_cycle * 2) - units_of(one_cycle)  # what one more cycle adds
    if period > DEFAULTS.detector_window:
        return
    before = prose(seed, lead) + " " if lead else ""
    found = detector()
    found.feed(before + one_cycle * (2 + 2 * DEFAULTS.detector_window // period) + " ")
    assert found.flagged
    assert found.flagged_at - units_of(before) <= found.flag_bound(period)


@settings(max_examples=100, deadline=None)
@given(
    n_words=st.integers(1, 60),
    seed=st.integers(0, 10**6),
    lead=st.integers(0, 300),
    repeats=st.integers(1, 8),
    separators=st.lists(SEPARATORS, min_size=1, max_size=3),
)
def test_an_exact_cycle_is_certain_within_its_documented_bound(n_words, seed, lead, repeats, separators) -> None:
    # With the defaults' REPEATS or any other: the flag becomes certain (it counts for the rule)
    # at most certain_bound(period) units after the cycle starts, whatever came before.
    rng = random.Random(seed)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 9))) for _ in range(n_words)
    ]
    one_cycle = cycle_text(words, separators, 1)
    period = units_of(one_cycle * 2) - units_of(one_cycle)
    if period > DEFAULTS.detector_window:
        return
    before = prose(seed, lead) + " " if lead else ""
    found = detector(repeats=repeats)
    enough = 2 + (period + DEFAULTS.detector_ngram + CERTAIN_UNITS + repeats * period) // period
    found.feed(before + one_cycle * enough + " ")
    assert found.certain and found.flagged_at <= found.certain_at
    assert found.certain_at - units_of(before) <= found.certain_bound(period)


@pytest.mark.parametrize("records", [4, 8, 12, 40, 200])
def test_a_list_of_records_is_flagged_at_most_never_certain(records: int) -> None:
    """A healthy answer that lists records (a value that changes in every one: a template's
    slot): a flag may come (provisional), but not its certainty, however long the list, so it
    never counts for the trip rule (hostile round 47: 16 records were certain)."""
    rows = "".join(
        f'  {{"id": {i}, "type": "book", "status": "available", "tags": ["new", "sale"], "shelf": "A"}},\n'
        for i in range(records)
    )
    for certain in (CERTAIN_UNITS, 128):
        found = detector(repeats=DEFAULTS.detector_repeats, certain_units=certain)
        found.feed("[\n" + rows + "]\nTotal: all of them available.")
        assert not found.certain


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(WORDS, SEPARATORS), min_size=1, max_size=50), st.text(max_size=2000))
def test_a_flagged_detector_stays_flagged(pieces, after) -> None:
    found = detector()
    found.feed("".join(w + s for w, s in pieces) * 300)
    if not found.flagged:
        return
    flagged_at = found.flagged_at
    assert found.feed(after) is True
    assert found.feed(prose(1, 500)) is True
    assert (found.flagged, found.flagged_at) == (True, flagged_at)


@pytest.mark.parametrize("seed", range(5))
def test_random_text_is_not_flagged(seed) -> None:
    found = fed(prose(seed, 20_000), list(range(0, 200_000, 7)))
    assert not found.flagged and found.units >= 20_000


@pytest.mark.parametrize(("period", "perturbed"), [(3, 0.0), (20, 0.05), (60, 0.05), (80, 0.0)])
def test_loops_are_flagged_within_200_units_of_their_start(period, perturbed) -> None:
    # The speed budget: short cycles, paragraph-long ones, near-loops with 5% of
    # their units replaced at random. Words of three letters: one unit each.
    for seed in range(10):
        rng = random.Random(seed)
        vocabulary = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3)) for _ in range(4000)]
        cycle = [rng.choice(vocabulary) for _ in range(period)]
        found = detector()
        before = prose(seed, 300) + " "
        found.feed(before)
        start = found.units
        for i in range(2000):
            found.feed((rng.choice(vocabulary) if rng.random() < perturbed else cycle[i % period]) + " ")
            if found.flagged:
                break
        assert found.flagged and found.flagged_at - start <= 200, (seed, found.flagged_at, start)


@pytest.mark.parametrize("character", ["a", "!", "\n", " "])
def test_a_run_of_one_character_is_cut_into_units_as_it_arrives(character) -> None:
    # A model stuck on one letter, one mark, or nothing but newlines or spaces: no separator
    # ever comes, yet the units advance (pieces of UNIT_CHARS; a white-space run's first
    # character only separates) and nothing is held back beyond one unfinished piece.
    found = detector()
    for _ in range(10_000):
        if found.feed(character):
            break
        assert len(found._pending) <= UNIT_CHARS
    assert found.flagged and found.flagged_at <= found.flag_bound(1)


def test_the_state_stays_within_the_window_and_each_delta_is_read_once() -> None:
    # Cost per delta: the units it completes, never a re-scan of what came before; memory:
    # what the window holds, however long the generation.
    found = detector()
    text = prose(7, 30_000)
    for start in range(0, len(text), 13):
        before = found.units
        found.feed(text[start : start + 13])
        assert found.units - before <= 13
        assert len(found._last_seen) <= found.window + 1 and len(found._order) <= found.window + 1
        assert len(found._history) <= found.window + 1
    assert not found.flagged


@pytest.mark.parametrize(
    "knobs",
    [{"ngram": 0}, {"window": 0}, {"drift": 0.0}, {"drift": 1.0}, {"threshold": 0.0}],
)
def test_settings_that_cannot_work_are_refused(knobs) -> None:
    with pytest.raises(ValueError, match="loop detector"):
        detector(**knobs)


def _templated(kind: str, seed: int) -> str:
    """Healthy output that fills one frame again and again with figures that change every time:
    a chain of thought in repeated steps, records, rows, an identity matrix."""
    rng = random.Random(seed)
    if kind == "cot steps":
        total, steps = rng.randint(1, 20), []
        for i in range(1, 11):
            add = rng.randint(1, 9)
            steps.append(f"Step {i}: He adds {add} more marbles to the jar, so the jar now has {total} + {add} = "
                         f"{total + add} marbles.")  # fmt: skip
            total += add
        return " ".join(steps) + f" The answer is {total}."
    if kind == "sql rows":
        names = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry"]
        return "\n".join(f"INSERT INTO people (name, age, city) VALUES ('{rng.choice(names)}', {rng.randint(18, 80)}, "
                         f"'{rng.choice(['Paris', 'Oslo', 'Rome', 'Vienna'])}');" for _ in range(12))  # fmt: skip
    return "$$\\begin{pmatrix}\n" + " \\\\\n".join(
        " & ".join("1" if i == j else "0" for j in range(8)) for i in range(8)
    ) + "\n\\end{pmatrix}$$"  # fmt: skip


@pytest.mark.parametrize("kind", ["cot steps", "sql rows", "identity matrix"])
def test_a_template_whose_figures_change_every_time_is_not_a_near_loop(kind: str) -> None:
    # The period lock credited every unit of a template's frame, so a healthy chain of thought
    # in ten repeated steps was flagged 181 times in 200 (a run of such answers trips, blanked).
    for seed in range(10):
        text = _templated(kind, seed)
        assert not fed(text, list(range(0, len(text), 7))).flagged, (kind, seed)
