"""The loop detector on real model outputs: AlpacaEval's published answers, 227 models x 805
instructions (about 183,000 answers).

The corpus is the public repository ``tatsu-lab/alpaca_eval``: every
``results/<model>/model_outputs.json`` (a list of ``{"instruction", "output", "generator", ...}``,
one per instruction). Get it with the session's ``fetch`` tool, source ``github:tatsu-lab/alpaca_eval``
(a bare git directory, e.g. ``/work/.mirror/tatsu-lab+alpaca_eval/repo``; read with ``git cat-file``),
or point ``--corpus`` at a checkout or extracted folder that holds ``results/``. An instruction's
id is its position in the first model's file that has it (instructions are matched by text).

Each answer is labelled without the detector:

- **DEGENERATE**: at least 1,000 characters, and its tail has collapsed: the last third
  compresses with zlib to at most 0.20 of its size (healthy prose and code: 0.35-0.6; 99% of
  long answers are above 0.2) AND its most frequent 16-character piece occurs at least 8 times
  in that last third (a short substring repeats many times at the end);
- **ORDINARY**: every other answer.

Then each answer is fed to a LoopDetector built from the project's Settings (the
``HYPERLOOM_EVAL_PROBE_DETECTOR_*`` environment, as in a run; ``--set name=value`` overrides any
keyword of LoopDetector) in deltas of 7 characters, as a stream delivers it. Reported: the
false-flag rate on ORDINARY answers (with its one-sided 95% upper bound), the catch rate on
DEGENERATE ones, the units and characters to the flag on caught ones, the instructions whose
ordinary answers are flagged for many models, and an emulation of "a flag must be earned by R
repeats": a flagged answer counts for R when its text holds a cycle of 1-200 units repeated at
least R times in a row, anywhere in it (units: runs of word characters, of punctuation or of 2+
white space characters, cut into pieces of at most 8; each period's copy may differ from the one
before it in at most 10% of its units, so periods under 10 units must repeat exactly). Holding
such a cycle is a strict, text-level reading of "R repeats": it says how far such a requirement
could cut false flags. LoopDetector's ``repeats`` is looser (it counts the units since its score
was last zero, not copies in a row), so it flags more: measured on the whole corpus, 506 false
flags at ``repeats=4`` against 314-374 emulated at R=4.

    python benchmarks/bench_detector_corpus.py --corpus /work/.mirror/tatsu-lab+alpaca_eval/repo \
        [--sample N --seed S] [--set repeats=4 --set threshold=20] [--show-flagged 5] [--json]

Runs in about 2.5 minutes over the whole corpus with 2 workers (``--workers``).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import math
import multiprocessing
import os
import random
import re
import subprocess
import sys
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_detector import upper_bound  # noqa: E402
from probe.runtime.core.contract import Settings, read_settings  # noqa: E402
from probe.runtime.core.degeneration import LoopDetector  # noqa: E402

DELTA_CHARS = 7  # a stream's delta: a few tokens
MIN_CHARS = 1000  # a degenerate answer is at least this long
TAIL_RATIO = 0.20  # ... its last third compresses to at most this share of its size
PIECE_CHARS = 16  # ... and its most frequent piece of this many characters
PIECE_COUNT = 8  # ... occurs at least this often in the last third
REPEATS = (2, 3, 4, 6, 8)  # the R of the "earned by R repeats" emulation
MAX_PERIOD = 200  # units: the longest cycle the emulation looks for
TOLERANCE = 0.10  # the share of a period's units that may differ from the copy before it
# The emulation's own units: runs of word characters, of punctuation, of 2+ white space
# characters, each cut into pieces of at most 8 characters.
_UNITS = re.compile(r"\w+|[^\w\s]+|\s{2,}")


@dataclass
class Answer:
    model: str
    instruction: int
    text: str


@dataclass
class Outcome:
    model: str
    instruction: int
    chars: int
    degenerate: bool
    tail_ratio: float
    piece_count: int
    flagged_at: int | None  # the unit of the flag
    flag_char: int | None  # the characters fed when it flagged
    repeats: int  # the most consecutive copies of one cycle in the text (flagged answers only)


# --------------------------------------------------------------------------------- corpus


def load_corpus(corpus: Path) -> tuple[list[Answer], list[str]]:
    """Every (model, instruction id, answer) in ``corpus`` (a bare git directory of
    tatsu-lab/alpaca_eval, or a folder holding ``results/<model>/model_outputs.json``), and the
    instructions' texts by id."""
    files: list[tuple[str, bytes]] = []
    if (corpus / "results").is_dir():
        for path in sorted((corpus / "results").glob("*/model_outputs.json")):
            files.append((path.parent.name, path.read_bytes()))
    else:
        git = ["git", "--git-dir", str(corpus)]
        listing = subprocess.run([*git, "ls-tree", "-r", "HEAD", "results"], capture_output=True, text=True, check=True)
        blobs = []
        for line in listing.stdout.splitlines():
            meta, path = line.split("\t", 1)
            parts = path.split("/")
            if len(parts) == 3 and parts[2] == "model_outputs.json":
                blobs.append((parts[1], meta.split()[2]))
        with subprocess.Popen([*git, "cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as cat:
            assert cat.stdin is not None and cat.stdout is not None
            for model, sha in sorted(blobs):
                cat.stdin.write(f"{sha}\n".encode())
                cat.stdin.flush()
                header = cat.stdout.readline().decode().split()
                if header[-1] == "missing":  # the mirror leaves out some of the largest files
                    print(f"missing from the mirror: {model}", file=sys.stderr)
                    continue
                files.append((model, cat.stdout.read(int(header[2]))))
                cat.stdout.read(1)
            cat.stdin.close()
    ids: dict[str, int] = {}
    answers = []
    for model, data in files:
        for record in json.loads(data):
            text, instruction = record.get("output"), record.get("instruction")
            if isinstance(text, str) and isinstance(instruction, str):
                answers.append(Answer(model, ids.setdefault(instruction, len(ids)), text))
    return answers, list(ids)


# ------------------------------------------------------------------------------- labels


def tail_collapse(text: str) -> tuple[float, int]:
    """The zlib ratio of the last third of ``text``, and how often its most frequent
    PIECE_CHARS-character piece occurs there."""
    tail = text[-(len(text) // 3) :] if len(text) >= 3 else text
    raw = tail.encode()
    ratio = len(zlib.compress(raw)) / max(1, len(raw))
    pieces = Counter(tail[j : j + PIECE_CHARS] for j in range(max(1, len(tail) - PIECE_CHARS + 1)))
    return ratio, pieces.most_common(1)[0][1] if pieces else 0


def is_degenerate(chars: int, ratio: float, count: int) -> bool:
    return chars >= MIN_CHARS and ratio <= TAIL_RATIO and count >= PIECE_COUNT


# ----------------------------------------------------------------------------- detector


def make_detector(settings: Settings, **overrides: Any) -> LoopDetector:
    """The detector of a run under ``settings``: each keyword LoopDetector takes gets the
    Settings field ``detector_<keyword>`` where there is one (ngram, window, drift, threshold,
    repeats, ...); ``overrides`` go to LoopDetector as keywords on top (any it takes)."""
    keywords: dict[str, Any] = {
        name: getattr(settings, f"detector_{name}")
        for name in inspect.signature(LoopDetector.__init__).parameters
        if name != "self" and hasattr(settings, f"detector_{name}")
    }
    keywords.update(overrides)
    return LoopDetector(**keywords)


def flag_point(detector: LoopDetector, text: str, certain: bool = False) -> tuple[int | None, int | None]:
    """(unit, characters fed) at which ``text``, fed in deltas of DELTA_CHARS, is flagged (with
    ``certain``: at which its flag becomes certain, the point where it counts for the rule)."""
    for start in range(0, len(text), DELTA_CHARS):
        if detector.feed(text[start : start + DELTA_CHARS]) and (not certain or detector.certain):
            return (detector.certain_at if certain else detector.flagged_at), min(len(text), start + DELTA_CHARS)
    return None, None


def longest_repeat(text: str, max_period: int = MAX_PERIOD, tolerance: float = TOLERANCE) -> int:
    """The most consecutive copies of one cycle of 1..max_period units in ``text``: for a
    period P, a stretch where every P consecutive units differ from the P before them in at
    most floor(tolerance * P) units holds (its length + P) / P copies."""
    import numpy as np

    pieces: list[str] = []
    for unit in _UNITS.findall(text):
        pieces += [unit[i : i + 8] for i in range(0, len(unit), 8)]  # a long run: several units
    codes: dict[str, int] = {}
    units = np.fromiter((codes.setdefault(p, len(codes)) for p in pieces), dtype=np.int64, count=len(pieces))
    best = 1 if len(units) else 0
    for period in range(1, min(max_period, len(units) // 2) + 1):
        if len(units) < best * period:
            break  # no stretch this long can hold more copies than already found
        differs = (units[:-period] != units[period:]).astype(np.int64)
        allowed = math.floor(tolerance * period)
        # Windows of P comparisons (starting at j) with at most `allowed` differences.
        sums = np.concatenate(([0], np.cumsum(differs)))
        good = (sums[period:] - sums[:-period]) <= allowed
        if not good.any():
            continue
        # The longest run of good windows: g windows cover g + P - 1 comparisons, i.e.
        # g + 2P - 1 units, (g + 2P - 1) // P copies.
        edges = np.flatnonzero(np.diff(np.concatenate(([0], good.astype(np.int8), [0]))))
        run = int((edges[1::2] - edges[::2]).max())
        best = max(best, (run + 2 * period - 1) // period)
    return best


# ------------------------------------------------------------------------------- workers

_SETTINGS: Settings | None = None
_OVERRIDES: dict[str, Any] = {}
_CERTAIN = False  # --certain: where a flag becomes certain (counts for the rule), not where it is raised


def _init(settings: Settings, overrides: dict[str, Any], certain: bool = False) -> None:
    global _SETTINGS, _OVERRIDES, _CERTAIN
    _SETTINGS, _OVERRIDES, _CERTAIN = settings, overrides, certain


def measure(answer: Answer) -> Outcome:
    assert _SETTINGS is not None
    text = answer.text
    ratio, count = tail_collapse(text)
    unit, char = flag_point(make_detector(_SETTINGS, **_OVERRIDES), text, _CERTAIN)
    repeats = longest_repeat(text) if unit is not None else 0
    degenerate = is_degenerate(len(text), ratio, count)
    return Outcome(answer.model, answer.instruction, len(text), degenerate, ratio, count, unit, char, repeats)


# ---------------------------------------------------------------------------------- run


def quantiles(values: list[int]) -> dict[str, int | None]:
    ordered = sorted(values)
    if not ordered:
        return {"median": None, "p90": None, "max": None}
    return {"median": ordered[len(ordered) // 2], "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "max": ordered[-1]}  # fmt: skip


def summarize(outcomes: list[Outcome], instructions: list[str]) -> dict[str, Any]:
    ordinary = [o for o in outcomes if not o.degenerate]
    degenerate = [o for o in outcomes if o.degenerate]
    false_flags = [o for o in ordinary if o.flagged_at is not None]
    caught = [o for o in degenerate if o.flagged_at is not None]
    per_instruction: dict[int, list[Outcome]] = defaultdict(list)
    for o in ordinary:
        per_instruction[o.instruction].append(o)
    clusters = []
    for instruction, group in per_instruction.items():
        flagged = sum(o.flagged_at is not None for o in group)
        if flagged:
            clusters.append({"instruction": instruction, "flagged": flagged, "models": len(group),
                             "share": flagged / len(group), "text": instructions[instruction]})  # fmt: skip
    clusters.sort(key=lambda c: (-c["share"], -c["flagged"], c["instruction"]))
    emulation = []
    for r in REPEATS:
        f = sum(o.repeats >= r for o in false_flags)
        c = sum(o.repeats >= r for o in caught)
        emulation.append({"R": r, "false_flags": f, "false_flag_rate": f / max(1, len(ordinary)),
                          "upper_95": upper_bound(f, max(1, len(ordinary))), "caught": c,
                          "catch_rate": c / max(1, len(degenerate))})  # fmt: skip
    by_model = Counter(o.model for o in false_flags)
    return {
        "answers": len(outcomes), "models": len({o.model for o in outcomes}),
        "instructions": len({o.instruction for o in outcomes}),
        "ordinary": len(ordinary), "false_flags": len(false_flags),
        "false_flag_rate": len(false_flags) / max(1, len(ordinary)),
        "false_flag_upper_95": upper_bound(len(false_flags), max(1, len(ordinary))),
        "false_flags_with_tail_ratio_under_0_35": sum(o.tail_ratio < 0.35 for o in false_flags),
        "degenerate": len(degenerate), "caught": len(caught), "catch_rate": len(caught) / max(1, len(degenerate)),
        "units_to_flag": quantiles([o.flagged_at for o in caught if o.flagged_at is not None]),
        "chars_to_flag": quantiles([o.flag_char for o in caught if o.flag_char is not None]),
        "clusters": clusters, "instructions_with_a_false_flag": len(clusters),
        "false_flags_by_model": by_model.most_common(15), "repeats_emulation": emulation,
    }  # fmt: skip


def markdown(summary: dict[str, Any], settings: dict[str, Any], top: int = 15) -> str:
    s = summary
    lines = [f"Detector: {settings}", "",
             f"{s['answers']} answers, {s['models']} models, {s['instructions']} instructions; "
             f"{s['degenerate']} DEGENERATE, {s['ordinary']} ORDINARY", "",
             "| class | answers | flagged | rate | one-sided 95% upper bound |", "|---|---|---|---|---|",
             f"| ORDINARY (false flags) | {s['ordinary']} | {s['false_flags']} | {s['false_flag_rate']:.4%} | "
             f"{s['false_flag_upper_95']:.4%} |",
             f"| DEGENERATE (caught) | {s['degenerate']} | {s['caught']} | {s['catch_rate']:.2%} | |", "",
             f"False flags whose tail zlib ratio is under 0.35 (repetitive-looking): "
             f"{s['false_flags_with_tail_ratio_under_0_35']}", "",
             "| to the flag (caught DEGENERATE) | median | p90 | max |", "|---|---|---|---|"]  # fmt: skip
    for key in ("units_to_flag", "chars_to_flag"):
        q = s[key]
        lines.append(f"| {key.replace('_', ' ')} | {q['median']} | {q['p90']} | {q['max']} |")
    lines += ["", "Emulated 'a flag needs R consecutive copies of a cycle' (flagged answers that hold one):", "",
              "| R | false flags | rate | 95% upper | caught | catch rate |", "|---|---|---|---|---|---|",
              f"| (as is) | {s['false_flags']} | {s['false_flag_rate']:.4%} | {s['false_flag_upper_95']:.4%} | "
              f"{s['caught']} | {s['catch_rate']:.2%} |"]  # fmt: skip
    for row in s["repeats_emulation"]:
        lines.append(f"| {row['R']} | {row['false_flags']} | {row['false_flag_rate']:.4%} | {row['upper_95']:.4%} | "
                     f"{row['caught']} | {row['catch_rate']:.2%} |")  # fmt: skip
    lines += ["", f"Instructions with at least one flagged ORDINARY answer: {s['instructions_with_a_false_flag']}; "
              f"the top {top} by share of models flagged:", "",
              "| id | flagged / models | share | instruction |", "|---|---|---|---|"]  # fmt: skip
    for c in s["clusters"][:top]:
        excerpt = " ".join(c["text"].split())[:90].replace("|", "/")
        lines.append(f"| {c['instruction']} | {c['flagged']}/{c['models']} | {c['share']:.1%} | {excerpt} |")
    lines += ["", "False flags by model (top 15): " + ", ".join(f"{m} {n}" for m, n in s["false_flags_by_model"])]
    return "\n".join(lines)


def show_flagged(outcomes: list[Outcome], texts: dict[tuple[str, int], str], n: int, seed: int) -> str:
    flagged = [o for o in outcomes if not o.degenerate and o.flagged_at is not None]
    lines = [f"{min(n, len(flagged))} of {len(flagged)} flagged ORDINARY answers (seed {seed}), around the flag:"]
    for o in random.Random(seed).sample(flagged, min(n, len(flagged))):
        text, at = texts[(o.model, o.instruction)], o.flag_char or 0
        lines += ["", f"--- {o.model}, instruction {o.instruction}: {o.chars} chars, flagged at unit {o.flagged_at} "
                  f"(char {at}); tail zlib {o.tail_ratio:.2f}, top piece x{o.piece_count}, cycle repeats {o.repeats}",
                  text[max(0, at - 600) : at] + " <<FLAG>> " + text[at : at + 200]]  # fmt: skip
    return "\n".join(lines)


def parse_set(values: list[str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--set wants name=value, not {item!r}")
        try:
            overrides[name.strip()] = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            overrides[name.strip()] = raw.strip()
    return overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="tatsu-lab/alpaca_eval: git dir or folder")
    parser.add_argument("--sample", type=int, default=0, help="answers to sample at random (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a LoopDetector keyword to override (repeatable)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--show-flagged", type=int, default=0, metavar="N")
    parser.add_argument("--top", type=int, default=15, help="instructions to list")
    parser.add_argument(
        "--certain", action="store_true", help="count where a flag becomes certain (what the rule counts), not raised"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings, warnings = read_settings(os.environ)
    for warning in warnings:
        print(warning, file=sys.stderr)
    overrides = parse_set(args.set)
    try:  # fails here, not in a worker, on a keyword LoopDetector does not take (or a bad value)
        detector = make_detector(settings, **overrides)
    except (TypeError, ValueError) as error:
        raise SystemExit(f"--set {overrides}: {error}") from None
    described = {
        name: getattr(detector, name)
        for name in inspect.signature(LoopDetector.__init__).parameters
        if name != "self" and hasattr(detector, name)
    } | overrides
    started = time.perf_counter()
    answers, instructions = load_corpus(args.corpus)
    if args.sample and args.sample < len(answers):
        answers = random.Random(args.seed).sample(answers, args.sample)
    if args.workers > 1:
        with multiprocessing.get_context("fork").Pool(args.workers, _init, (settings, overrides, args.certain)) as pool:
            outcomes = pool.map(measure, answers, chunksize=256)
    else:
        _init(settings, overrides, args.certain)
        outcomes = [measure(a) for a in answers]
    summary = summarize(outcomes, instructions)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    print(markdown(summary, described, args.top))
    print(f"\n({summary['seconds']} s)")
    if args.show_flagged:
        print("\n" + show_flagged(outcomes, {(a.model, a.instruction): a.text for a in answers}, args.show_flagged,
                                  args.seed))  # fmt: skip
    if args.json:
        summary["detector"] = described
        summary["outcomes_flagged"] = [asdict(o) for o in outcomes if o.flagged_at is not None]
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
