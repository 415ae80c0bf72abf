"""The loop detector's false flags on healthy text, its speed on loops, and what it adds to
the run-level false-trip probability.

Healthy text that can be had offline, each text fed as one generation (in deltas of a few
characters, as a stream delivers it):

- **cot**: every worked exemplar (few-shot target, answer, rationale or solution of 100+
  characters) in lm-eval's task files: gsm8k-cot, bbh's cot prompts, minerva math (its
  ``utils.py``), and every other task that ships one;
- **prose**: long technical prose from the Python standard library: the ``pydoc_data`` topics
  and the docstrings of 600+ characters in its modules;
- **adversarial**: healthy outputs built to look repetitive: long enumerations, tables,
  repeated code lines, digit strings, a poem with a refrain, a multiplication table, a log.

Then the loops: tokens (units) to the flag on a short exact cycle, a paragraph-long cycle and
a near-loop with 5% of its units replaced, and that random text is never flagged. Last, the
run-level false-trip probability, computed exactly as ``bench_rule.py`` does (its functions),
for a healthy model whose generations are pathological with probability
``p_eff = p + (1 - p) f``: p its true at-cap rate, f the detector's false-flag rate (as
measured, and at its one-sided 95% upper confidence bound).

    python benchmarks/bench_detector.py [--n 1319] [--json]

Knobs come from the environment (``HYPERLOOM_EVAL_PROBE_DETECTOR_*``), as in a run.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import math
import os
import random
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_rule import _prob, first_fire_distribution  # noqa: E402
from probe.runtime.core.contract import Settings, read_settings  # noqa: E402
from probe.runtime.core.degeneration import LoopDetector  # noqa: E402

HEALTHY_RATES = (0.0, 0.1, 0.2, 0.3)
EXEMPLAR_KEYS = ("target", "answer", "rationale", "solution", "output", "completion")
DELTA_CHARS = 7  # a stream's delta: a few tokens


def detector(settings: Settings) -> LoopDetector:
    return LoopDetector(
        settings.detector_ngram, settings.detector_window, settings.detector_drift, settings.detector_threshold
    )


# --------------------------------------------------------------------------- healthy text


def lm_eval_exemplars() -> list[str]:
    """Every worked exemplar shipped in lm-eval's task files (YAML few-shot samples, and the
    samples minerva math lists in Python)."""
    import lm_eval
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # lm-eval's !function tags
    root = Path(lm_eval.__file__).parent / "tasks"
    found: list[str] = []
    for path in sorted(glob.glob(str(root / "**" / "*.yaml"), recursive=True)):
        try:
            document = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=Loader)
        except Exception:
            continue
        samples = ((document or {}).get("fewshot_config") or {}).get("samples") if isinstance(document, dict) else None
        found += [v for s in samples or [] if isinstance(s, dict) for v in _exemplar_values(s)]
    for path in sorted(glob.glob(str(root / "**" / "*.py"), recursive=True)):
        try:
            tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                with _quiet():
                    found += _exemplar_values(ast.literal_eval(node))
    return sorted(set(found))


class _quiet:
    """Skip a dict literal that is not made of constants."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> bool:
        return kind is not None and issubclass(kind, ValueError)


def _exemplar_values(sample: Any) -> list[str]:
    if not isinstance(sample, dict):
        return []
    return [v for k, v in sample.items() if k in EXEMPLAR_KEYS and isinstance(v, str) and len(v) >= 100]


def stdlib_prose() -> list[str]:
    """The pydoc topics and the standard library's long docstrings (600+ characters)."""
    import pydoc_data.topics

    found = list(pydoc_data.topics.topics.values())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")):
        if "test" in path.parts[-2:][0] or path.name.startswith("test"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node)
                if text and len(text) >= 600:
                    found.append(text)
    return sorted(set(found))


def adversarial(seed: int = 7) -> dict[str, str]:
    """Healthy outputs that repeat their shape on purpose."""
    rng = random.Random(seed)
    fruits = ["apple", "banana", "cherry", "date", "elderberry", "fig", "grape", "kiwi", "lemon", "mango"]
    refrain = (
        "And still the river runs, and still the river sings,\nof all the little harbours and the boats it brings.\n"
    )
    stanzas = []
    for i in range(8):
        lines = [
            " ".join(rng.choice([*fruits, "light", "stone", "morning", "field", "wind"]) for _ in range(7))
            for _ in range(4)
        ]
        stanzas.append(f"Verse {i + 1}:\n" + "\n".join(lines) + "\n" + refrain)
    texts = {
        "enumeration 1-400": "\n".join(f"{i}. Item number {i}" for i in range(1, 401)),
        "comma list 1-1000": ", ".join(str(i) for i in range(1, 1001)),
        "fruit list": "\n".join(
            f"- {rng.choice(fruits)}: {rng.randint(1, 99)} kg at ${rng.randint(1, 9)}.{rng.randint(0, 99):02d}"
            for _ in range(200)
        ),
        "markdown table": "| id | name | score | passed |\n|---|---|---|---|\n"
        + "\n".join(
            f"| {i} | {rng.choice(fruits)} | {rng.randint(0, 100)} | {rng.choice(['yes', 'no'])} |" for i in range(200)
        ),
        "zero table": "| a | b | c | d |\n|---|---|---|---|\n"
        + "\n".join(f"| {i} | 0 | 0 | {i % 2} |" for i in range(100)),
        "multiplication table": "\n".join(f"{a} x {b} = {a * b}" for a in range(2, 13) for b in range(1, 13)),
        "repeated code lines": "\n".join(f"    config[{i}] = load_value(path, {i})" for i in range(150)),
        "asserts": "\n".join(f"assert add({i}, {2 * i}) == {3 * i}" for i in range(150)),
        "digits of a long number": "".join(str(rng.randrange(10)) for _ in range(6000)),
        "grouped digits": " ".join(f"{rng.randrange(10**4):04d}" for _ in range(1500)),
        "poem with a refrain": "\n\n".join(stanzas),
        "log lines": "\n".join(
            f"2026-12-01 12:{i // 4:02d}:{15 * (i % 4):02d} INFO worker-{rng.randint(1, 8)} processed batch {i} "
            f"in {rng.randint(10, 999)} ms"
            for i in range(240)
        ),
        "step by step arithmetic": " ".join(f"Step {i}: {i * 7} + {i * 3} = {i * 10}." for i in range(1, 120)),
        **_templates(rng, fruits),
    }
    return texts


def _templates(rng: random.Random, fruits: list[str]) -> dict[str, str]:
    """Healthy outputs that fill one frame again and again with figures that change every time
    (the shape a near-loop detector's period lock must not take for a loop)."""
    records = [
        {"name": rng.choice(fruits), "weight": rng.randint(1, 99), "price": rng.randint(100, 999) / 100}
        for _ in range(10)
    ]
    total, steps = rng.randint(1, 20), []
    for i in range(1, 13):
        add = rng.randint(1, 9)
        steps.append(f"Step {i}: She puts {add} more {rng.choice(fruits)}s in the basket, so it now holds "
                     f"{total} + {add} = {total + add} pieces of fruit.")  # fmt: skip
        total += add
    return {
        "chain of thought in repeated steps": " ".join(steps) + f" The answer is {total}.",
        "JSON records (indent 2)": "```json\n" + json.dumps(records, indent=2) + "\n```",
        "SQL inserts": "\n".join(
            f"INSERT INTO stock (fruit, kg, price) VALUES ('{r['name']}', {r['weight']}, {r['price']});"
            for r in records
        ),
        "HTML table": "<table>\n"
        + "\n".join(f"  <tr><td>{r['name']}</td><td>{r['weight']}</td><td>{r['price']}</td></tr>" for r in records)
        + "\n</table>",
        "identity matrix (LaTeX)": "$$\\begin{pmatrix}\n"
        + " \\\\\n".join(" & ".join("1" if i == j else "0" for j in range(8)) for i in range(8))
        + "\n\\end{pmatrix}$$",
    }


# --------------------------------------------------------------------------------- loops


def _vocabulary(rng: random.Random, size: int = 5000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 4))) for _ in range(size)]


def loop_units_to_flag(settings: Settings, period: int, perturbed: float, seed: int, lead: int = 200) -> int | None:
    """Units from a loop's start to its flag: ``lead`` words of random text, then a cycle of
    ``period`` words (one unit each) with a share ``perturbed`` replaced at random."""
    rng = random.Random(seed)
    vocabulary = _vocabulary(rng)
    found = detector(settings)
    found.feed(" ".join(rng.choice(vocabulary) for _ in range(lead)) + " ")
    start = found.units
    cycle = [rng.choice(vocabulary) for _ in range(period)]
    for i in range(20_000):
        if found.feed((rng.choice(vocabulary) if rng.random() < perturbed else cycle[i % period]) + " "):
            return found.flagged_at - start  # type: ignore[operator]
    return None


def units_of(settings: Settings, text: str) -> int:
    """How many units ``text`` makes (fed whole, with a space so that nothing is held back)."""
    found = LoopDetector(settings.detector_ngram, settings.detector_window, 0.5, math.inf)
    found.feed(text + " ")
    return found.units


def flagged_in(settings: Settings, text: str) -> int | None:
    """The unit at which ``text``, fed in deltas of DELTA_CHARS, is flagged; None if never."""
    found = detector(settings)
    for start in range(0, len(text), DELTA_CHARS):
        if found.feed(text[start : start + DELTA_CHARS]):
            return found.flagged_at
    return None


# ----------------------------------------------------------------------------- statistics


def upper_bound(flags: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper-Pearson upper bound of a rate seen ``flags`` times in ``n``."""
    if flags >= n:
        return 1.0
    alpha = 1 - confidence
    low, high = flags / n, 1.0
    for _ in range(100):  # bisection: P(X <= flags | q) = alpha
        middle = (low + high) / 2
        if _binomial_cdf(flags, n, middle) > alpha:
            low = middle
        else:
            high = middle
    return high


def _binomial_cdf(k: int, n: int, q: float) -> float:
    if q <= 0.0:
        return 1.0
    if q >= 1.0:
        return 0.0 if k < n else 1.0
    log_q, log_1q = math.log(q), math.log1p(-q)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_q + (n - i) * log_1q
        for i in range(k + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def trip_probability(p: float, f: float, n: int, settings: Settings) -> float:
    """P(a healthy run of ``n`` observations trips), a generation being pathological with
    probability p + (1 - p) f (bench_rule's exact recursion)."""
    return sum(first_fire_distribution(p + (1 - p) * f, n, settings.min_samples, settings.length_ratio))


# ----------------------------------------------------------------------------------- run


def run(settings: Settings, n: int) -> dict[str, Any]:
    started = time.perf_counter()
    sources = {"cot": lm_eval_exemplars(), "prose": stdlib_prose()}
    named = adversarial()
    sources["adversarial"] = list(named.values())
    healthy: dict[str, Any] = {}
    all_flags = all_texts = 0
    chars = units = 0
    for name, texts in sources.items():
        flags = []
        for text in texts:
            at = flagged_in(settings, text)
            chars, units = chars + len(text), units + units_of(settings, text)
            if at is not None:
                flags.append({"at_unit": at, "start": text[:100]})
        healthy[name] = {"texts": len(texts), "flagged": len(flags), "rate": len(flags) / len(texts),
                         "upper_95": upper_bound(len(flags), len(texts)), "examples": flags[:5]}  # fmt: skip
        all_flags, all_texts = all_flags + len(flags), all_texts + len(texts)
    adversarial_flags = {name: flagged_in(settings, text) for name, text in named.items()}
    f, f_high = all_flags / all_texts, upper_bound(all_flags, all_texts)
    cot = healthy["cot"]
    loops = {}
    for label, period, perturbed in (("short cycle (3 words)", 3, 0.0), ("paragraph cycle (80 words)", 80, 0.0),
                                     ("near-loop (20 words, 5% perturbed)", 20, 0.05),
                                     ("near-loop (80 words, 5% perturbed)", 80, 0.05),
                                     ("near-loop (80 words, 15% perturbed)", 80, 0.15)):  # fmt: skip
        found = [loop_units_to_flag(settings, period, perturbed, seed) for seed in range(50)]
        caught = sorted(x for x in found if x is not None)
        loops[label] = {"caught": len(caught), "of": len(found), "median": caught[len(caught) // 2] if caught else None,
                        "max": caught[-1] if caught else None}  # fmt: skip
    for character, name in (("a", "a letter"), ("\n", "a newline")):
        one_character = detector(settings)
        flagged_at = next((i for i in range(1, 10**5) if one_character.feed(character)), None)
        loops[f"{name} repeated (characters to flag)"] = {"caught": 1, "of": 1, "median": flagged_at, "max": None}
    rng = random.Random(3)
    vocabulary = _vocabulary(rng)
    randoms = [" ".join(rng.choice(vocabulary) for _ in range(16_384)) for _ in range(20)]
    clock = time.perf_counter()
    random_flags = sum(flagged_in(settings, text) is not None for text in randoms)
    seconds = time.perf_counter() - clock
    random_units = sum(units_of(settings, text) for text in randoms)
    table = []
    for p in HEALTHY_RATES:
        alone = trip_probability(p, 0.0, n, settings)
        row = {"p": p, "cap_rule_alone": alone}
        for key, rate in (("measured", f), ("upper_95", f_high), ("cot_upper_95", cot["upper_95"])):
            row[key] = trip_probability(p, rate, n, settings)
        table.append(row)
    return {
        "settings": {k: v for k, v in settings.as_dict().items() if "DETECTOR" in k},
        "min_samples": settings.min_samples, "length_ratio": settings.length_ratio, "n": n,
        "healthy": healthy, "adversarial": adversarial_flags, "false_flag_rate": f, "false_flag_upper_95": f_high,
        "texts": all_texts, "chars_per_unit": chars / max(1, units), "loops": loops,
        "random_16k_units_flagged": f"{random_flags}/20", "trip_table": table,
        "microseconds_per_unit": round(1e6 * seconds / random_units, 2),
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Detector settings: {result['settings']}", "",
             "| healthy text | texts | flagged | rate | 95% upper bound |", "|---|---|---|---|---|"]  # fmt: skip
    for name, row in result["healthy"].items():
        lines.append(f"| {name} | {row['texts']} | {row['flagged']} | {row['rate']:.4f} | {row['upper_95']:.4f} |")
    lines.append(f"| all | {result['texts']} | {round(result['false_flag_rate'] * result['texts'])} | "
                 f"{result['false_flag_rate']:.4f} | {result['false_flag_upper_95']:.4f} |")  # fmt: skip
    lines += ["", "Adversarial healthy outputs (unit of the flag, or -):", ""]
    lines += [f"- {name}: {at if at is not None else '-'}" for name, at in result["adversarial"].items()]
    lines += ["", f"Characters per unit over all healthy text: {result['chars_per_unit']:.2f}", "",
              "| loop | caught | median units to flag | max |", "|---|---|---|---|"]  # fmt: skip
    for label, row in result["loops"].items():
        lines.append(f"| {label} | {row['caught']}/{row['of']} | {row['median']} | {row['max']} |")
    lines += ["", "Flagged healthy texts (first of each source):", ""]
    lines += [f"- {name}, at unit {x['at_unit']}: {x['start']!r}" for name, row in result["healthy"].items()
              for x in row["examples"][:3]]  # fmt: skip
    lines += ["", f"Random text, 16,384 words: flagged in {result['random_16k_units_flagged']} generations; "
              f"{result['microseconds_per_unit']} us per unit, fed in deltas of {DELTA_CHARS} characters", "",
              f"P(a healthy run trips) at N={result['n']}, MIN_SAMPLES={result['min_samples']}, "
              f"LENGTH_RATIO={result['length_ratio']}: p_eff = p + (1 - p) f", "",
              "| p | cap rule alone | with the detector (f measured) | difference | f at its 95% bound | "
              "f at cot's 95% bound |", "|---|---|---|---|---|---|"]  # fmt: skip
    for row in result["trip_table"]:
        lines.append(f"| {row['p']} | {_prob(row['cap_rule_alone'])} | {_prob(row['measured'])} | "
                     f"{_prob(row['measured'] - row['cap_rule_alone'])} | {_prob(row['upper_95'])} | "
                     f"{_prob(row['cot_upper_95'])} |")  # fmt: skip
    lines += ["", f"({result['seconds']} s)"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1319, help="observations per run (GSM8K's test set: 1319)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings, warnings = read_settings(os.environ)
    for warning in warnings:
        print(warning, file=sys.stderr)
    result = run(settings, args.n)
    print(markdown(result))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
