"""``eval-probe``: the one command line of lm-eval-probe."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from probe import exitcodes
from probe.reader.evidence import DEFAULT_MAX_CAP_RATE
from probe.runtime.core.contract import PROBE_VERSION
from probe.terminal import fit

if TYPE_CHECKING:
    from patcher.files import Outcome

USAGE_ERROR = exitcodes.USAGE

# The one list of commands in the top-level --help (argparse prints it from these).
SUMMARIES = {
    "demo": "start a simulated never-stopping server, evaluate a bundled task with lm-eval unprobed and "
    "probed, and compare them (no GPU, no download)",
    "run": "run any command (typically python -m lm_eval ...) with the probe active",
    "read": "turn a result directory into a verdict per task (ok / below_floor / unavailable)",
    "patch": "put the probe into InferenceX's benchmark_lib.sh (or check, unpatch, preview)",
    "install": "write the probe as DIR/sitecustomize.py for any lm-eval run",
    "body": "print the exact text that gets injected into a sitecustomize.py",
}

EPILOG = """knobs (environment): HYPERLOOM_EVAL_PROBE=0|false|off disables the probe;
HYPERLOOM_EVAL_PROBE_MIN_SAMPLES (16), HYPERLOOM_EVAL_PROBE_LENGTH_RATIO (0.75, 0.5 to 1),
HYPERLOOM_EVAL_PROBE_MIN_MAX_TOKENS (1024), HYPERLOOM_EVAL_PROBE_SLOW_START (auto|on|off),
HYPERLOOM_EVAL_PROBE_STREAM (auto|on|off), HYPERLOOM_EVAL_PROBE_DETECTOR (on) and its
HYPERLOOM_EVAL_PROBE_DETECTOR_NGRAM (10), _WINDOW (256), _DRIFT (0.6), _THRESHOLD (20).
The sidecar goes to $RESULT_DIR, else $EVAL_RESULT_DIR, else the current directory; the
evidence of every task also goes into lm-eval's results_*.json (hyperloom_eval_probe)."""


class _Parser(argparse.ArgumentParser):
    """argparse that exits with USAGE_ERROR, so usage errors never look like a verdict."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


# ASCII decimal notation (an exponent allowed) only: float() and int() also take "nan", "inf", "1_0" and
# non-ASCII digits ("\uff11\uff16", "\u0661\u0666"), which no one means as an option value.
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_COUNT = re.compile(r"\d+", re.ASCII)


def finite_float(text: str) -> float:
    """An option's value as a finite float; ArgumentTypeError (a usage error) otherwise."""
    value = float(text) if _DECIMAL.fullmatch(text) else math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a finite number in ASCII decimal notation, an exponent allowed (e.g. 0.5 or 1e-3)"
        )
    return value


def rate(text: str) -> float:
    """An option's value as a share between 0 and 1; ArgumentTypeError otherwise."""
    value = finite_float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share between 0 and 1")
    return value


def positive_int(text: str) -> int:
    """An option's value as an integer of at least 1; ArgumentTypeError otherwise."""
    if not _COUNT.fullmatch(text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1 in plain digits")
    return int(text)


MAX_DEMO_DOCS = 100_000  # the demo writes its task before it says anything: gsm8k has 1,319


def demo_docs(text: str) -> int:
    """The demo's document count: positive_int, at most MAX_DEMO_DOCS."""
    value = positive_int(text)
    if value > MAX_DEMO_DOCS:
        raise argparse.ArgumentTypeError(
            f"{text[:24]!r} is more documents than the demo writes (at most {MAX_DEMO_DOCS:,})"
        )
    return value


def _cmd_body(args: argparse.Namespace) -> int:
    from probe.inject import sitecustomize_text

    if args.sources:
        from probe.inject import embedded_sources

        sources = embedded_sources().items()
        _print("".join(f"# ===== _hyperloom_eval_probe.{name} =====\n{source}\n" for name, source in sources), end="")
        return 0
    _print(sitecustomize_text(chain=args.standalone), end="")
    return 0


def _carry_out(command: str, action: Callable[[], Outcome]) -> int:
    """Print what a file operation did, or why it refused; return its exit code."""
    from patcher.errors import PatchError

    try:
        outcome = action()
    except PatchError as error:
        print(f"eval-probe {command}: {error}\nThe file was left untouched.", file=sys.stderr)
        return error.code
    _print(outcome.message)
    return outcome.code


def _cmd_patch(args: argparse.Namespace) -> int:
    from patcher.files import check_file, patch_file, unpatch_file
    from probe.inject import payload

    path = Path(args.path)
    if args.check:
        return _carry_out("patch", lambda: check_file(path, payload()))
    if args.unpatch:
        return _carry_out("patch", lambda: unpatch_file(path, dry_run=args.dry_run))
    return _carry_out("patch", lambda: patch_file(path, payload(), dry_run=args.dry_run))


def _cmd_install(args: argparse.Namespace) -> int:
    from patcher.install import install
    from probe.inject import payload

    return _carry_out("install", lambda: install(Path(args.directory), payload()))


def _cmd_run(args: argparse.Namespace) -> int:
    from probe.run import run

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("eval-probe run: give the command after --, e.g. eval-probe run -- lm_eval ...", file=sys.stderr)
        return USAGE_ERROR
    return run(command, args.result_dir)


def _cmd_read(args: argparse.Namespace) -> int:
    from probe.reader import render
    from probe.reader.verdict import classify_all, select, worst

    options = (args.metric, not args.lower_is_better, args.max_cap_rate, args.cap_rate_fails)
    verdicts = classify_all(args.result_dir, args.floor, *options, newest_only=args.newest)
    if args.task is not None:
        verdicts = select(verdicts, args.task)
    if args.format == "json":
        # allow_nan=False: strict JSON for orchestrators; the reader never lets a non-finite
        # number into a verdict, and should one slip in, that is an internal error.
        shown = [v.to_json() for v in verdicts]
        text = json.dumps(shown[0] if args.task is not None and len(shown) == 1 else shown, indent=2,
                          allow_nan=False)  # fmt: skip
    elif args.format == "markdown":
        text = render.markdown(verdicts).rstrip("\n")
    elif args.task is not None:
        text = "\n\n".join(render.describe(v) for v in verdicts)
    else:
        text = render.table(verdicts)
    _print(fit(text) if args.format == "text" else text)
    return exitcodes.READ_STATUS[worst(verdicts).value]


def _print(text: str, end: str = "\n") -> None:
    """Print ``text``; a reader that stopped reading (``| head``) is not an error of ours."""
    try:
        print(text, end=end, flush=True)
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _cmd_demo(args: argparse.Namespace) -> int:
    from probe.demo.compare import demo

    if (args.base_url is None) != (args.model is None):
        given, missing = ("--model", "--base-url") if args.base_url is None else ("--base-url", "--model")
        print(f"eval-probe demo: {given} needs {missing}: a real server is named by both its URL and its "
              "served model name (without either, the demo runs its own simulated model)", file=sys.stderr)  # fmt: skip
        return USAGE_ERROR
    return demo(args.base_url, args.model, args.docs, args.max_tokens, args.concurrency)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="eval-probe",
        description="lm-eval-probe: notice inside lm-eval that a served model never stops generating, "
        "end the waste in minutes, and explain the resulting zero.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lm-eval-probe {PROBE_VERSION}")
    commands = parser.add_subparsers(dest="name", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, handler: Callable[[argparse.Namespace], int], help: str, **kw: object) -> _Parser:
        # The top-level list shows the command's summary; its own --help shows the description.
        sub = commands.add_parser(name, help=SUMMARIES[name], description=help, **kw)  # type: ignore[arg-type]
        sub.set_defaults(handler=handler)
        return sub

    body = command(
        "body",
        _cmd_body,
        "Print the exact text injected into a sitecustomize.py.",
        epilog=exitcodes.epilog(exitcodes.BODY),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    body.add_argument(
        "--standalone", action="store_true", help="the variant for a sitecustomize.py of our own (chains the next one)"
    )
    body.add_argument(
        "--sources", action="store_true", help="print the runtime modules the text carries packed, as they run"
    )

    patch = command(
        "patch",
        _cmd_patch,
        "Put the probe into InferenceX's benchmark_lib.sh, inside _patch_lm_eval(), right before the "
        "'export PYTHONPATH=...' line that ends it.",
        epilog=exitcodes.epilog(exitcodes.PATCH, "In every non-zero case except 1 the file is left untouched."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    patch.add_argument("path", help="path to benchmark_lib.sh")
    mode = patch.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="report whether the file holds the current probe")
    mode.add_argument("--unpatch", action="store_true", help="remove the probe block, restoring the file exactly")
    patch.add_argument("--dry-run", action="store_true", help="print the unified diff; write nothing")

    install = command(
        "install",
        _cmd_install,
        "Write the probe as DIR/sitecustomize.py (or add it to one there).",
        epilog=exitcodes.epilog(exitcodes.INSTALL),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    install.add_argument("directory", help="a directory to put first on PYTHONPATH")

    run = command(
        "run",
        _cmd_run,
        "Run COMMAND with the probe active, then print a verdict; exits with COMMAND's exit code.",
        usage="eval-probe run [--result-dir DIR] -- COMMAND...",
        epilog=exitcodes.epilog(exitcodes.RUN),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--result-dir", help="where the sidecar goes (default: the --output_path in COMMAND, else a new directory)"
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")

    read = command(
        "read",
        _cmd_read,
        "Judge every run a result directory holds: a verdict per task (ok, below_floor or unavailable), each "
        "naming its results file and run.",
        epilog=exitcodes.epilog(exitcodes.READ, exitcodes.READ_NOTE),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    read.add_argument("result_dir", help="lm-eval's --output_path (holds the sidecar and <model>/results_*.json)")
    read.add_argument(
        "--floor",
        type=finite_float,
        default=0.01,
        help="the lowest usable score: a finite number in ASCII decimal notation, an exponent allowed "
        "(0.5, .5, 1e-3; default 0.01)",
    )
    read.add_argument(
        "--task", help="judge this task only, in every run (what fails a whole run stays; default: every task)"
    )
    read.add_argument("--metric", help="metric key, e.g. exact_match,strict-match (default: first accuracy-like)")
    read.add_argument("--lower-is-better", action="store_true", help="the metric is an error rate, not an accuracy")
    read.add_argument(
        "--max-cap-rate",
        type=rate,
        default=DEFAULT_MAX_CAP_RATE,
        help="above this share of cut-off generations a score carries a caveat with its bound "
        f"(default {DEFAULT_MAX_CAP_RATE:g})",
    )
    read.add_argument(
        "--cap-rate-fails", action="store_true", help="a task above --max-cap-rate is below_floor (a hard stop)"
    )
    read.add_argument(
        "--newest",
        action="store_true",
        help="judge only the newest run of each model directory and concurrency (default: every run there)",
    )
    read.add_argument(
        "--format",
        choices=("text", "json", "markdown"),
        default="text",
        help="text (default), json, or a Markdown table for $GITHUB_STEP_SUMMARY",
    )
    read.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="the same as --format json: a list; with --task, one object when exactly one verdict applies "
        "(a re-run, several concurrencies or a failed evaluation make it a list: accept both)",
    )

    demo = command(
        "demo",
        _cmd_demo,
        "Evaluate a bundled task against a never-stopping model, unprobed then probed, and compare. "
        "Needs lm-eval installed beside eval-probe.",
        epilog=exitcodes.epilog(exitcodes.DEMO),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--base-url", help="a real OpenAI-compatible server, with --model (default: a simulated one, in-process)"
    )
    demo.add_argument("--model", help="the model name the server at --base-url serves (needed with it)")
    demo.add_argument(
        "--docs", type=demo_docs, default=64, help=f"documents in the task (default 64, at most {MAX_DEMO_DOCS:,})"
    )
    demo.add_argument("--max-tokens", type=positive_int, default=4096, help="the per-request budget (default 4096)")
    demo.add_argument("--concurrency", type=positive_int, default=16, help="lm-eval's num_concurrent (default 16)")
    return parser


def main(argv: list[str] | None = None) -> int:
    # A name the terminal's encoding cannot show (a task, a path) is escaped, never a crash.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return USAGE_ERROR
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        # Ctrl-C is the user's choice, not a bug: no traceback, the shell's code for it.
        print(f"eval-probe {args.name}: interrupted", file=sys.stderr)
        return exitcodes.INTERRUPTED
    except Exception:
        # A bug of ours must never exit with a code that reads as a verdict or an outcome.
        traceback.print_exc()
        print(f"eval-probe {args.name}: internal error (above); exit {exitcodes.INTERNAL}. "
              "Please report it with the traceback.", file=sys.stderr)  # fmt: skip
        return exitcodes.INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
