"""Where an lm-eval command line puts its results, read the way lm-eval's own parser reads it.

lm-eval parses its options with argparse, so many spellings name its output path. This module
rebuilds lm-eval's option table in a neutral argparse parser and lets argparse decide. The table
comes from the lm-eval importable here, else from a copy of 0.4.13's (``FALLBACK``). See
docs/cli.md.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from probe.runtime.evaluator.results import results_dir_at

# One option: its strings and argparse's nargs (0 for a flag that takes no value).
Option = tuple[tuple[str, ...], int | str | None]

# `lm_eval run`'s options in lm-eval 0.4.13, the newest release (tests compare it with the real
# parser). The 0.4.9.2 release differs (-m for --model, single-valued --tasks), and so does
# InferenceX's lm-eval (b315ef3: --tasks takes zero or more values, --cache_requests exactly one,
# no --trackio_args); never for --output_path or any option that shares a prefix with it.
FALLBACK: tuple[Option, ...] = (
    (("-h", "--help"), 0), (("--config", "-C"), None), (("--tasks", "-t"), "+"), (("--model", "-M"), None),
    (("--model_args", "-a"), "+"), (("--apply_chat_template",), "?"), (("--limit", "-L"), None),
    (("--use_cache", "-c"), None), (("--num_fewshot", "-f"), None), (("--batch_size", "-b"), None),
    (("--max_batch_size",), None), (("--device",), None), (("--gen_kwargs",), "+"), (("--output_path", "-o"), None),
    (("--log_samples", "-s"), 0), (("--samples", "-E"), None), (("--cache_requests",), "?"),
    (("--check_integrity",), 0), (("--system_instruction",), None), (("--fewshot_as_multiturn",), "?"),
    (("--include_path",), None), (("--verbosity", "-v"), None), (("--write_out", "-w"), 0), (("--show_config",), 0),
    (("--wandb_args",), "+"), (("--wandb_config_args",), "+"), (("--trackio_args",), "+"),
    (("--hf_hub_log_args",), "+"), (("--predict_only", "-x"), 0), (("--seed",), None), (("--trust_remote_code",), 0),
    (("--confirm_run_unsafe_code",), 0), (("--metadata",), "+"),
)  # fmt: skip

_PROGRAMS = ("lm_eval", "lm-eval")  # the console scripts
_MODULES = ("lm_eval", "lm_eval.__main__")  # python -m ...


class _Refused(Exception):
    """lm-eval's parser would refuse this command line (lm-eval then writes nowhere)."""


class _NeutralParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Refused(message)


def options_from_lm_eval() -> tuple[Option, ...] | None:
    """The option table of the lm-eval importable here, or None when there is none.

    InferenceX's lm-eval (b315ef3) and the releases from 0.4.10 on parse ``lm_eval run`` (the
    default subcommand) with ``HarnessCLI``; the 0.4.9.2 release and earlier ones build one parser
    in ``lm_eval.__main__.setup_parser``.
    """
    try:
        try:
            from lm_eval._cli.harness import HarnessCLI

            parser = HarnessCLI()._subparsers.choices["run"]
        except ImportError:
            from lm_eval.__main__ import setup_parser

            parser = setup_parser()
        actions = parser._actions
    # Any failure of someone else's package here only means "no table from it": fall back.
    except Exception:
        return None
    return tuple((tuple(a.option_strings), a.nargs) for a in actions if a.option_strings)


def _parser(options: Sequence[Option]) -> _NeutralParser:
    parser = _NeutralParser(add_help=False, allow_abbrev=True, exit_on_error=False)
    for strings, nargs in options:
        dest = max(strings, key=len).lstrip("-").replace("-", "_")
        if nargs == 0:
            parser.add_argument(*strings, dest=dest, action="store_true")
        else:
            parser.add_argument(*strings, dest=dest, nargs=nargs)  # type: ignore[arg-type]
    return parser


def lm_eval_arguments(command: Sequence[str]) -> list[str]:
    """The words of ``command`` that lm-eval parses.

    They follow ``lm_eval``, ``lm-eval`` or ``-m lm_eval``, and a ``run`` subcommand. When lm-eval's
    entry is not visible, they are all but the first word.
    """
    rest = list(command[1:])
    for i, word in enumerate(command):
        if os.path.basename(word) in _PROGRAMS:
            rest = list(command[i + 1 :])
            break
        if word == "-m" and i + 1 < len(command) and command[i + 1] in _MODULES:
            rest = list(command[i + 2 :])
            break
        if word.startswith("-m") and word[2:] in _MODULES:
            rest = list(command[i + 1 :])
            break
    return rest[1:] if rest[:1] == ["run"] else rest


def output_path_in(command: Sequence[str], options: Sequence[Option] | None = None) -> str | None:
    """The ``--output_path`` lm-eval would take from ``command``, in any spelling its parser
    accepts; None when there is none or lm-eval would refuse the command line.

    ``options`` is lm-eval's option table (default: the importable lm-eval's, else ``FALLBACK``).
    """
    known = _known(command, options)
    return getattr(known, "output_path", None) if known is not None else None


def results_dir_of(command: Sequence[str], options: Sequence[Option] | None = None) -> str | None:
    """Where lm-eval run by ``command`` writes its results: its ``--output_path``, else the
    ``output_path`` its ``--config`` file sets (read where PyYAML is importable); the directory
    of a path that names a ``.json`` file, since lm-eval writes ``<stem>_<time>.json`` beside it.
    None when it cannot be told."""
    path = output_path_in(command, options)
    known = _known(command, options) if path is None else None
    if known is not None and getattr(known, "config", None):
        path = _output_path_in_config(known.config)
    return results_dir_at(path) if isinstance(path, str) else None


def _known(command: Sequence[str], options: Sequence[Option] | None) -> argparse.Namespace | None:
    table = options if options is not None else (options_from_lm_eval() or FALLBACK)
    try:
        known, _ = _parser(table).parse_known_args(lm_eval_arguments(command))
    except (_Refused, argparse.ArgumentError):
        return None
    return known


def _output_path_in_config(config: str) -> str | None:
    """The ``output_path`` of lm-eval's YAML ``config`` file; None when it has none or cannot be read."""
    try:
        import yaml

        with open(config, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except Exception:  # no PyYAML, no file, not YAML: not known
        return None
    value = document.get("output_path") if isinstance(document, dict) else None
    return value if isinstance(value, str) else None
