"""``eval-probe run -- COMMAND``: run any command (typically lm_eval) with the probe active."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probe import processgroup
from probe.inject import sitecustomize_text
from probe.lmeval_args import results_dir_of
from probe.reader.documents import Unreadable
from probe.reader.evidence import cap_rate, run_evidence
from probe.reader.sidecar import read_sidecar
from probe.runtime.core.contract import ENV_REPORT, EVIDENCE_KEY, RESULT_DIR_VARS, cause_words
from probe.runtime.core.sidecar import is_count
from probe.runtime.scope.log import PREFIX
from probe.runtime.scope.report import noted_trips, read_report

# SIGQUIT too: Ctrl-\ at a terminal reaches only eval-probe (the command has a session of its own).
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# After the command itself ends, how long what it started may take to end too (a signalled
# lm-eval under bash exits just after bash) before it counts as left behind.
_GRACE_S = 2.0


def run(command: list[str], result_dir: str | None = None) -> int:
    """Run ``command`` with the probe, then print a short verdict; returns its exit code.

    The probe lives in a temporary sitecustomize.py directory put first on PYTHONPATH
    (it chains any sitecustomize.py it shadows). Signals sent to this process (Ctrl-C
    included) are passed on to the command's whole process group, and on Linux the command
    is killed when this process dies, even by SIGKILL. When the command ends but processes
    it started still run, a warning names them, and the directory stays until the last of
    them ends (a detached process removes it then), so they run probed; otherwise it is
    removed at once. A results directory made here (no ``--result-dir`` and no
    ``--output_path``) is removed when it stays empty or the command never starts, unless
    such processes may still write to it; otherwise the summary names it.
    """
    # From the first moment to the last: a signal before the command starts stops it from
    # starting, and one while the summary is written is passed on, never lets anything leak.
    with _Forwarder() as forwarder:
        return _run(command, result_dir, forwarder)


def _run(command: list[str], result_dir: str | None, forwarder: _Forwarder) -> int:
    chosen = result_dir or results_dir_of(command)
    made: Path | None = None
    if chosen:
        result = Path(chosen).resolve()
    else:
        made = result = Path(tempfile.mkdtemp(prefix="eval-probe-results-")).resolve()
    site = Path(tempfile.mkdtemp(prefix="eval-probe-site-"))
    report = site / "observed.json"
    left_behind: list[str] = []
    try:
        (site / "sitecustomize.py").write_text(sitecustomize_text(chain=True), encoding="utf-8")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
        env[RESULT_DIR_VARS[0]] = str(result)
        env[ENV_REPORT] = str(report)
        for flag in _unhooking_flags(command):
            _say(f"WARNING: {flag} keeps Python from reading PYTHONPATH or sitecustomize.py: the probe cannot "
                 "load in that process, and nothing will watch its generations")  # fmt: skip
        if forwarder.pending:
            number = forwarder.pending[0]
            _say(f"summary: signal {number} ({_signal_name(number)}) arrived before the command started; not started")
            return 128 + number
        ran = _run_forwarding_signals(
            command, env, f"probe active; sidecar and results go to {result}", str(site), forwarder
        )
        if ran is None:
            return 127
        status, group, followed, left_behind = ran
        if left_behind:
            processgroup.remove_when_empty(group, site, str(site), followed)
            _say(_left_behind_warning(left_behind, site, result))
        line = summary(result, report, -status if status < 0 else None, len(left_behind))
        if made is not None and _holds_anything(made):
            line += f"; results kept in {made}"
        _say(line)
        return 128 - status if status < 0 else status
    finally:
        if not left_behind:  # else the processes still running keep it, and it goes when they do
            shutil.rmtree(site, ignore_errors=True)
        if made is not None and not left_behind:
            with contextlib.suppress(OSError):
                made.rmdir()  # only when empty: what the command wrote there stays


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies (Linux's
    PR_SET_PDEATHSIG); None where that is not available. Without it, a SIGKILLed ``eval-probe
    run`` would leave lm-eval running, still sending requests to the server."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not after the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


class _Forwarder:
    """While entered, SIGINT, SIGTERM, SIGHUP and SIGQUIT go to the command's process group once it has
    one (``group``), and are kept in ``pending`` until then. Job control works as without the
    wrapper: Ctrl-Z (SIGTSTP) stops the command's group and then this process, and SIGCONT (the
    shell's ``fg`` or ``bg``) continues both. (The command runs in a session of its own, where the
    kernel drops SIGTSTP: its group gets SIGSTOP.)"""

    def __init__(self) -> None:
        self.group: int | None = None
        self.pending: list[int] = []
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _Forwarder:
        self._previous = {sig: signal.signal(sig, self._forward) for sig in _FORWARDED}
        self._previous[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, self._suspend)
        self._previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, self._resume)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def started(self, group: int) -> None:
        """The command leads ``group`` now: what arrived before goes to it."""
        self.group = group
        while self.pending:
            processgroup.signal_group(group, self.pending.pop(0))

    def _suspend(self, _number: int, _frame: object) -> None:
        if self.group is not None:
            processgroup.signal_group(self.group, signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped, as the shell expects of its job

    def _resume(self, _number: int, _frame: object) -> None:
        if self.group is not None:
            processgroup.signal_group(self.group, signal.SIGCONT)

    def _forward(self, number: int, _frame: object) -> None:
        if self.group is None:
            self.pending.append(number)
        else:
            processgroup.signal_group(self.group, number)


def _run_forwarding_signals(
    command: list[str], env: dict[str, str], started: str, marker: str, forwarder: _Forwarder
) -> tuple[int, int, set[int], list[str]] | None:
    """Run ``command``; None if it could not start, else its exit status (negative: the signal
    that ended it), its process group, the groups of the processes found outside it, and the
    processes still running once it and a short grace period have ended: those of its group (and
    of those groups), and those whose environment holds ``marker``."""
    try:
        # Its own session, so its own process group: a terminal's Ctrl-C reaches it once, through
        # us, and what we pass on reaches everything it started (bash -c "python -m lm_eval ...").
        child = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_die_with_parent())
    except OSError as error:
        _say(f"cannot start {command[0]!r}: {error.strerror}")
        return None
    _say(started)
    group = child.pid  # a session leader leads its group; the id stays its while a member lives
    forwarder.started(group)  # a signal that came while it was being started goes to it now
    status = child.wait()
    followed: set[int] = set()  # the groups of processes that left it (setsid), once seen
    return status, group, followed, processgroup.wait_until_empty(group, _GRACE_S, marker, followed)


def _left_behind_warning(members: list[str], site: Path, result: Path) -> str:
    return (
        f"WARNING: the command has ended, but {len(members)} process(es) it started still run: "
        + "; ".join(members)
        + f". The probe stays available to them ({site} is removed once they have all ended), and their "
        f"sidecar and results go to {result}; the summary below does not cover what they do: run "
        f"eval-probe read {result} once they finish. Signals sent to eval-probe no longer reach them, and never "
        "reached one outside its process group (setsid)."
    )


def summary(result_dir: Path, report: Path, ended_by: int | None = None, still_running: int = 0) -> str:
    """The summary line: what the command's trip record says, else what the probe's report says,
    else what is known. It speaks only for the command's own evaluations (those its report names,
    and those whose trip was noted before its record was written) and only for what the probe
    watched; ``ended_by`` is the signal that ended the command, if one did. Any other trip record is
    another run's.
    With ``still_running`` processes the command started still at work, no trip yet is no verdict."""
    signalled = "" if ended_by is None else f"the command was ended by signal {ended_by} ({_signal_name(ended_by)})"
    sidecar = read_sidecar(result_dir)
    if sidecar.state == "unreadable":
        return f"summary: the sidecar is unreadable ({sidecar.error})" + (f"; {signalled}" if signalled else "")
    other = ""
    # A trip record is this command's only when one of its evaluations wrote it: the report names
    # their run identities (a killed command reports none: then its start time decides).
    evaluations = read_report(str(report))
    # The command's run identities: its evaluations', and those of its trips (noted before each
    # record is written, so a process killed before it reported still counts).
    noted = noted_trips(str(report))
    ours = {e.get("run_id") for e in evaluations} | noted
    if sidecar.state == "valid" and sidecar.trip.get("run_id") not in ours:
        other = f"; the sidecar {sidecar.path} is another run's, not this one's"
    elif sidecar.state == "valid":
        v = sidecar.trip
        cut = sidecar.final.get("short_circuited_requests") if sidecar.final else "?"
        # Several of the command's evaluations tripped into this directory (each later one moved
        # the earlier record aside): the report has each one's count.
        tripped = [e for e in evaluations if e.get("tripped") is True]
        if len(tripped) > 1 and _as_written(tripped):
            cut = f"{sum(_short_circuited(e) for e in tripped)} (in {len(tripped)} of {len(evaluations)} evaluations)"
        what, advice = cause_words(v.get("cause"))
        also = _trips_elsewhere(report, sidecar.path)
        return (
            f"summary: TRIPPED ({v['pathology']}): {v['pathological']}/{v['observations']} generations {what} "
            f"(max_tokens {v['max_tokens'] or 'not recorded'}); {cut} requests short-circuited; "
            f"what to change: {advice}. "
            f"Sidecar: {sidecar.path}. "
            + (f"Tripped too, its trip record elsewhere: {'; '.join(also)}. " if also else "")
            + (f"Then {signalled}. " if signalled else "")
            + f"Next: eval-probe read {result_dir}"
            + "".join(f"; eval-probe read {Path(path).parent}" for path in also)
            + (f"; still running then: {still_running} process(es) it started (listed above)" if still_running else "")
        )
    unreported = sorted(noted - {e.get("run_id") for e in evaluations})
    if unreported:  # it tripped, then its process ended before it reported (killed, os._exit)
        return (
            f"summary: TRIPPED in {len(unreported)} evaluation(s) that ended before they reported (run "
            f"{', '.join(unreported)}), whose trip record is not in {result_dir}"
            + other
            + (f". Then {signalled}" if signalled else "")
            + ". Next: eval-probe read the results directory of that run"
        )
    if still_running:
        return (
            "summary: not known yet (no trip record of this run so far)"
            + (f"; {signalled}" if signalled else "")
            + f"; still running then: {still_running} process(es) it started (listed above): run eval-probe read "
            f"{result_dir} once they finish"
        )
    if not evaluations and os.path.lexists(report):  # the probe writes one only with evaluations in it
        return (
            f"summary: not known: the probe's report {report} cannot be read as one it writes{other}"
            + (f"; {signalled}" if signalled else "")
            + f"; run eval-probe read {result_dir}"
        )
    if not evaluations and not os.path.lexists(f"{report}.active"):
        return (
            "summary: NOT WATCHED: the probe was active in no process of the command (no lm-eval ran, or it ran "
            "where PYTHONPATH does not reach: python -I, -E or -S, sudo, env -i, a container, a remote shell), so "
            "it observed nothing" + other + (f"; {signalled}" if signalled else "")
        )
    if not evaluations:
        if signalled:
            # The probe reports when Python exits normally; a signal stops that, so nothing else is known.
            return f"summary: {signalled}; no sidecar of this run in {result_dir}, so the probe had not tripped by then"
        # lm-eval loaded the probe somewhere (a helper that imported it, say), but no evaluation ended
        # under it, and none tripped: never "did not trip", which a user reads as healthy.
        return (
            "summary: NOT WATCHED to its end: lm-eval loaded the probe, but no evaluation under it ended, and none "
            "tripped (an lm-eval run where PYTHONPATH does not reach is not watched: python -I, -E or -S, sudo, env "
            "-i, a container, a remote shell; one killed before its end reports nothing)" + other
        )
    tripped = [e for e in evaluations if e.get("tripped") is True]
    if tripped:  # its command gave lm-eval a results directory of its own (RESULT_DIR, --output_path)
        where = _trips_elsewhere(report, None)
        return (
            f"summary: TRIPPED in {len(tripped)} of {len(evaluations)} evaluation(s), whose trip record is not in "
            f"{result_dir}: "
            + ("; ".join(where) if where else "written by another process of the run")
            + other
            + (f". Then {signalled}" if signalled else "")
            + ". Next: "
            + ("; ".join(f"eval-probe read {Path(w).parent}" for w in where) or "eval-probe read its results directory")
        )
    if not _as_written(evaluations):
        return (
            f"summary: not known: no evaluation in the probe's report {report} says it tripped, but its figures are "
            f"not as the probe writes them{other}"
            + (f"; {signalled}" if signalled else "")
            + f"; run eval-probe read {result_dir}"
        )
    groups = [g for e in evaluations for g in e["groups"]]
    tasks = [(name, figures) for e in evaluations for name, figures in e["tasks"].items()]
    counted = [f for _, f in tasks] + [e["unattributed"] for e in evaluations if e.get("unattributed")]
    seen = sum(g["observations"] for g in groups)
    # A group's pathological count holds its loop flags too: a flag is not a generation cut off.
    flagged = sum(min(g.get("flagged", 0), g["pathological"]) for g in groups if is_count(g.get("flagged", 0)))
    cut = sum(g["pathological"] for g in groups) - flagged
    rates = [(name, cap_rate(figures)) for name, figures in tasks]
    worst = max(((name, rate) for name, rate in rates if rate), key=lambda found: found[1], default=None)
    unjudged = sum(f.get("below_min_max_tokens", 0) + f.get("unknown_budget", 0) for f in counted)
    highest = f"; most cut off: {worst[0]}, {worst[1]:.1%} of its generations" if worst else ""
    if unjudged:  # counted in the evidence, not by the rule: a budget below MIN_MAX_TOKENS, or unknown
        highest = f"; {unjudged} more observed under a budget the rule does not judge{highest}"
    return (
        f"summary: the probe did not trip: {cut} of {seen} generations observed were cut off"
        + (f", {flagged} more flagged as looping while they ran" if flagged else "")
        + f", in {len(groups)} group(s) of generation settings of {len(evaluations)} evaluation(s){highest}{other}"
        + (f"; then {signalled}" if signalled else "")
    )


def _short_circuited(evaluation: dict) -> int:
    """How many requests the probe answered blank in one evaluation of the report."""
    counted = [*evaluation["tasks"].values(), *([evaluation["unattributed"]] if evaluation.get("unattributed") else [])]
    return sum(f.get("short_circuited", 0) for f in counted if is_count(f.get("short_circuited", 0)))


def _holds_anything(directory: Path) -> bool:
    """Whether ``directory`` holds an entry, or the command put something else in its place (False
    when the command removed it, or it cannot be read)."""
    try:
        return not stat.S_ISDIR(directory.lstat().st_mode) or any(directory.iterdir())
    except OSError:
        return False


def _unhooking_flags(command: list[str]) -> list[str]:
    """What in a Python ``command`` keeps the probe out, as the user wrote it: Python's ``-I``,
    ``-E`` or ``-S`` (also bundled, as ``-IS``), read up to its script, ``-c`` or ``-m``; and
    before it, ``env`` clearing the environment or replacing or unsetting ``PYTHONPATH``."""
    words, found = _after_env(command)
    if not words or not os.path.basename(words[0]).startswith("python"):
        return sorted(set(found))
    arguments = iter(words[1:])
    for argument in arguments:
        if argument == "--check-hash-based-pycs":
            next(arguments, None)  # its value is the next word
            continue
        if not argument.startswith("-") or argument in ("-", "--"):
            break
        if argument.startswith("--"):
            continue  # --help, --version: nothing runs
        for i, letter in enumerate(argument[1:], 1):
            if letter in "IES":
                found.append(f"-{letter}")
            elif letter in "cm":
                return sorted(set(found))  # what follows is the code or the module
            elif letter in "WX":
                if i == len(argument) - 1:
                    next(arguments, None)  # its value is the next word
                break  # the rest of the word is its value
    return sorted(set(found))


# GNU env's options that take a value, short and long.
_ENV_VALUED = {"u": "--unset", "C": "--chdir", "S": "--split-string", "a": "--argv0"}


def _after_env(command: list[str]) -> tuple[list[str], list[str]]:
    """``command`` past a leading ``env`` and its options and assignments, and what of those keeps
    the probe out (``env -i``, ``env -u PYTHONPATH``, ``env PYTHONPATH=...``); ``env -S STRING`` is
    read as the words it splits into."""
    if not command or os.path.basename(command[0]) != "env":
        return list(command), []
    words, found = list(command[1:]), []
    while words:
        word = words.pop(0)
        if word == "--":
            break
        if word in ("-", "-i", "--ignore-environment"):
            found.append("env -i")
            continue
        option, value = "", None
        if word.startswith("--"):
            option, equals, value = word.partition("=")
            value = value if equals else (words.pop(0) if option in _ENV_VALUED.values() and words else None)
        elif word.startswith("-"):
            for i, letter in enumerate(word[1:], 1):
                if letter == "i":
                    found.append("env -i")
                elif letter in _ENV_VALUED:
                    option = _ENV_VALUED[letter]
                    value = word[i + 1 :] or (words.pop(0) if words else "")
                    break
        elif "=" in word:
            if word.partition("=")[0] == "PYTHONPATH":
                found.append("env PYTHONPATH=...")
            continue
        else:
            words.insert(0, word)
            break
        if option == "--unset" and value == "PYTHONPATH":
            found.append("env -u PYTHONPATH")
        elif option == "--split-string" and value is not None:
            with contextlib.suppress(ValueError):  # unbalanced quotes: env refuses it too
                words = shlex.split(value) + words
    return words, found


def _as_written(evaluations: list[dict]) -> bool:
    """Whether the report's evaluations are evidence documents as the probe writes them: each one
    as the reader trusts it in a results file (``run_evidence``), with groups whose counts hold
    and agree with its trip flag, a trip record named only where it tripped, task names that
    print as one line, and each task's recorded cut-off rate a fraction (the rate the summary
    prints comes from the counts). The report is a file any process of the command may write."""
    for evaluation in evaluations:
        try:
            run_evidence({EVIDENCE_KEY: evaluation})
        except Unreadable:
            return False
        groups = evaluation.get("groups")
        if not isinstance(groups, list) or not all(
            isinstance(g, dict) and type(g.get("tripped")) is bool and is_count(g.get("observations"))
            and is_count(g.get("pathological")) and g["pathological"] <= g["observations"] for g in groups
        ):  # fmt: skip
            return False
        if evaluation["tripped"] != any(g["tripped"] for g in groups) or (
            evaluation.get("sidecar") is not None and not evaluation["tripped"]
        ):
            return False
        tasks = evaluation["tasks"].items()
        if not all(name.isprintable() and _a_fraction(figures.get("cut_off_rate")) for name, figures in tasks):
            return False
    return True


def _a_fraction(rate: Any) -> bool:
    """Whether a task's cut-off rate is as the probe writes it: None (nothing observed) or a fraction."""
    return rate is None or (type(rate) in (int, float) and 0 <= rate <= 1)


def _trips_elsewhere(report: Path, here: str | Path | None) -> list[str]:
    """The trip records the report names for its evaluations that tripped, each file once however
    it is spelt, but the one at ``here``; a record that names no path (the report is a file any
    process may write) is left out."""
    found: dict[str, str] = {}
    for evaluation in read_report(str(report)):
        path = evaluation.get("sidecar")
        # Printed as it is: a path with a newline or an escape would forge the line.
        if evaluation.get("tripped") is True and isinstance(path, str) and path.strip() and path.isprintable():
            with contextlib.suppress(ValueError, OSError):  # a NUL, a lone surrogate
                found.setdefault(os.path.realpath(path), path)
    skip = None
    with contextlib.suppress(ValueError, OSError):
        skip = os.path.realpath(here) if here is not None else None
    return sorted(path for real, path in found.items() if real != skip)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _say(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)
