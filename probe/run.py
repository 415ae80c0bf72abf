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
import time
from collections.abc import Callable
from pathlib import Path

from probe import processgroup
from probe.inject import sitecustomize_text
from probe.lmeval_args import results_dir_of
from probe.runtime.core.contract import ENV_REPORT, ENV_SWITCH, RESULT_DIR_VARS, read_settings
from probe.runtime.scope.log import PREFIX, one_line
from probe.runtime.scope.report import forward_report, note_nested
from probe.summary import signal_name, summary

# SIGQUIT too: Ctrl-\ at a terminal reaches only eval-probe (the command has a session of its own).
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# After the command itself ends, how long what it started may take to end too (a signalled
# lm-eval under bash exits just after bash) before it counts as left behind.
_GRACE_S = 2.0


def run(command: list[str], result_dir: str | None = None) -> int:
    """Run ``command`` with the probe, then print a short verdict; returns its exit code.

    The probe lives in a temporary sitecustomize.py directory put first on PYTHONPATH. Signals to
    this process go to the command's whole process group. Processes the command leaves running are
    named, and run probed until they end. The temporary directories are then removed. See
    docs/cli.md.
    """
    # From the first moment to the last: a signal before the command starts stops it from
    # starting, and one while the summary is written is passed on, never lets anything leak.
    with _Forwarder() as forwarder:
        return _run(command, result_dir, forwarder)


def _run(command: list[str], result_dir: str | None, forwarder: _Forwarder) -> int:
    started = time.time()
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
        outer = env.get(ENV_REPORT)  # under another eval-probe run: its report hears of this one's evaluations
        env[ENV_REPORT] = str(report)
        if outer:  # read from there even if this one is killed; forwarded to it when this one ends
            note_nested(outer, str(report))
        settings, _ = read_settings(env)
        switched_off = "" if settings.enabled else env.get(ENV_SWITCH, "")
        for flag in _unhooking_flags(command):
            _say(f"WARNING: {flag} keeps Python from reading PYTHONPATH or sitecustomize.py: the probe cannot "
                 "load in that process, and nothing will watch its generations")  # fmt: skip
        if forwarder.pending:
            number = forwarder.pending[0]
            _say(f"summary: signal {number} ({signal_name(number)}) arrived before the command started; not started")
            return 128 + number
        ran = _run_forwarding_signals(command, env, _announcement(command, result, switched_off), str(site), forwarder)
        if ran is None:
            return 127
        status, group, followed, left_behind = ran
        if left_behind:
            processgroup.remove_when_empty(group, site, str(site), followed)
            _say(_left_behind_warning(left_behind, site, result))
        if outer:
            forward_report(str(report), outer)
        try:
            line = summary(result, report, ended_by=-status if status < 0 else None, still_running=len(left_behind),
                           switched_off=switched_off, started=started)  # fmt: skip
        except Exception as error:  # the command's records are any file; its exit code must never be lost
            line = f"summary: not known: its records could not be read ({error!r}); run eval-probe read {result}"
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
    """While entered, forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to the command's process group.

    Signals that come before the group exists wait in ``pending``. Job control works as without the
    wrapper: Ctrl-Z stops the command's group, then this process. SIGCONT continues both. See
    docs/cli.md.
    """

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
    """Run ``command``; None if it could not start.

    Else returns its exit status (negative: the signal that ended it) and its process group. It also
    returns the groups of processes found outside it, and the processes still running after a short
    grace period.
    """
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


def _announcement(command: list[str], result: Path, switched_off: str) -> str:
    """The line that starts the command: whether the probe is on, and where its output goes.

    The sidecar and lm-eval's results go to two places when ``--result-dir`` is not the command's
    output path.
    """
    if switched_off:
        return f"probe switched off ({ENV_SWITCH}={switched_off}): nothing is watched unless the command switches it on"
    output = results_dir_of(command)
    if output is not None and os.path.realpath(output) != os.path.realpath(result):
        return f"probe active; its sidecar goes to {result}, lm-eval's results to {os.path.abspath(output)}"
    return f"probe active; sidecar and results go to {result}"


def _holds_anything(directory: Path) -> bool:
    """Whether ``directory`` holds an entry, or the command put something else in its place.

    False when the command removed it, or it cannot be read.
    """
    try:
        return not stat.S_ISDIR(directory.lstat().st_mode) or any(directory.iterdir())
    except OSError:
        return False


def _unhooking_flags(command: list[str]) -> list[str]:
    """What in a Python ``command`` keeps the probe out, as the user wrote it.

    That is Python's ``-I``, ``-E`` or ``-S``, also bundled as ``-IS``, read up to the script,
    ``-c`` or ``-m``. Before it, an ``env`` that clears the environment or replaces or unsets
    ``PYTHONPATH`` counts too.
    """
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
    """``command`` past a leading ``env`` with its options and assignments, and what of those keeps
    the probe out.

    Such are ``env -i``, ``env -u PYTHONPATH`` and ``env PYTHONPATH=...``. ``env -S STRING`` is read
    as the words it splits into.
    """
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


def _say(message: str) -> None:
    """One line on stderr. A reader that went away (``| head -1``) must not end eval-probe, and
    with it the command, nor change its exit code: the lines are then dropped."""
    try:
        print(f"{PREFIX} {one_line(message)}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - it lives as long as the process
