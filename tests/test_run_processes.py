"""`eval-probe run -- bash -c "..."`: signals reach everything the command started, and what it
leaves running is named and stays probed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.procs import PYTHON

from probe import processgroup
from probe.demo.localtask import offline_env

# Reads process groups from /proc: Linux only. Does not depend on the lm-eval release.
pytestmark = [
    pytest.mark.release_independent,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="lists process groups from /proc (Linux)"),
]

# A Python grandchild (under bash, which stays as its parent because more follows it) that
# prints its pid and then sleeps; what it does on a signal is up to each test.
SLEEPER = "import os, signal, sys, time\n{setup}\nprint(os.getpid(), flush=True)\ntime.sleep({seconds})\n"


def runner(tmp_path: Path, shell: str, *args: str) -> subprocess.Popen:
    """``eval-probe run -- bash -c SHELL ARGS...``, its stdout and stderr piped, TMPDIR private."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    command = [PYTHON, "-m", "probe", "run", "--result-dir", str(tmp_path / "r"), "--", "bash", "-c", shell, *args]
    return subprocess.Popen(
        command, env=offline_env(None, TMPDIR=str(scratch)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def eventually(condition, seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def probe_sites(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "scratch").glob("eval-probe-site-*"))


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_a_signal_reaches_the_program_bash_runs(tmp_path: Path, number: int) -> None:
    # Before: only bash got it; it waits for its child, which ran on for the whole 60 s.
    setup = "signal.signal(signal.SIGINT, signal.default_int_handler)\n" + (
        "signal.signal({n}, lambda *_: (print('child got', {n}, flush=True), sys.exit(3)))".format(n=int(number))
        if number != signal.SIGINT
        else ""
    )
    child = SLEEPER.format(setup=setup, seconds=60)
    proc = runner(tmp_path, f'{PYTHON} -c "$0" || echo "child exited $?"', child)
    pid = int(proc.stdout.readline())
    time.sleep(0.2)
    proc.send_signal(number)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert not alive(pid)
    if number == signal.SIGINT:
        assert "KeyboardInterrupt" in err  # the child's own Ctrl-C, raised where it slept
    else:
        assert f"child got {int(number)}" in out
    assert "still run" not in err and probe_sites(tmp_path) == []


def test_what_outlives_a_signal_is_named_and_stays_probed(tmp_path: Path) -> None:
    out_file = tmp_path / "child.out"
    child = SLEEPER.format(setup="signal.signal(signal.SIGTERM, signal.SIG_IGN)", seconds=60)
    proc = runner(tmp_path, f'{PYTHON} -c "$0" > "$1" 2>&1 & wait', child, str(out_file))
    assert eventually(lambda: out_file.exists() and out_file.read_text().strip().isdigit())
    pid = int(out_file.read_text())
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM
        [warning] = [line for line in err.splitlines() if "WARNING" in line]
        assert f"1 process(es) it started still run: {pid} {PYTHON} -c import os" in warning
        [summary] = [line for line in err.splitlines() if line.startswith("[lm-eval-probe] summary:")]
        assert "ended by signal 15 (SIGTERM)" in summary and "still running then: 1 process(es)" in summary
        assert alive(pid) and len(probe_sites(tmp_path)) == 1  # kept for the process still running
    finally:
        os.kill(pid, signal.SIGKILL)
    assert eventually(lambda: probe_sites(tmp_path) == []), "the probe's directory outlived the last process"


def test_a_backgrounded_command_runs_probed_and_is_reported(tmp_path: Path) -> None:
    # A script that starts lm-eval in the background and exits. Before: the probe's directory was
    # gone before the backgrounded Python started, and nothing was said.
    seen = tmp_path / "seen.txt"
    late = f"import sitecustomize, pathlib; pathlib.Path({str(seen)!r}).write_text(sitecustomize.__file__)"
    proc = runner(tmp_path, f'(sleep 3; {PYTHON} -c "$0") >/dev/null 2>&1 &', late)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "WARNING: the command has ended, but 2 process(es) it started still run" in err
    assert "sleep 3" in err and "eval-probe read" in err
    assert eventually(seen.exists)
    loaded = Path(seen.read_text())
    assert loaded.name == "sitecustomize.py" and loaded.parent.parent == tmp_path / "scratch"
    assert eventually(lambda: probe_sites(tmp_path) == [])


def test_a_command_that_leaves_nothing_behind_is_not_warned_about(tmp_path: Path) -> None:
    proc = runner(tmp_path, "sleep 0.2 & wait; exit 4")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 4 and "WARNING" not in err and probe_sites(tmp_path) == []


def test_members_lists_each_live_process_of_the_group_once(tmp_path: Path) -> None:
    leader = subprocess.Popen(["bash", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        # A child shows bash's command line until it has exec'd sleep: wait for both execs.
        assert eventually(lambda: [m.split(" ", 1)[1] for m in processgroup.members(leader.pid)].count("sleep 30") == 2)
        found = processgroup.members(leader.pid)
        assert len(found) == 3 and found[0].startswith(f"{leader.pid} bash")
        assert processgroup.members(os.getpgrp()) != found
    finally:
        processgroup.signal_group(leader.pid, signal.SIGKILL)
        leader.wait()
    assert eventually(lambda: processgroup.members(leader.pid) == [])
    processgroup.signal_group(leader.pid, signal.SIGTERM)  # an empty group: nothing happens, no error


def test_a_process_that_left_the_group_with_setsid_is_named_and_stays_probed(tmp_path: Path) -> None:
    # `setsid lm_eval ... &` in a pipeline script. Before: nothing was said, and the probe's
    # directory was removed while the detached Python still had to start: it ran unprobed.
    seen = tmp_path / "seen.txt"
    late = f"import sitecustomize, pathlib; pathlib.Path({str(seen)!r}).write_text(sitecustomize.__file__)"
    proc = runner(tmp_path, f'setsid bash -c "sleep 3; {PYTHON} -c \\"\\$0\\"" "$0" >/dev/null 2>&1 &', late)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    [warning] = [line for line in err.splitlines() if "WARNING" in line]
    assert "sleep 3" in warning and "outside its process group" in warning, err
    assert eventually(seen.exists), "the detached process never ran probed"
    assert Path(seen.read_text()).parent.parent == tmp_path / "scratch"
    assert eventually(lambda: probe_sites(tmp_path) == []), "the probe's directory outlived the last process"


def test_nothing_found_counts_only_once_a_second_look_agrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A process in the middle of exec shows no environment for an instant, so one look can miss
    # the marker of a setsid process (CI: no warning, the site removed early). One that shows up
    # between the first look and the second is found: here it starts during the pause itself.
    marker = f"EVAL_PROBE_TEST_MARKER={tmp_path}"
    env = {**os.environ, "EVAL_PROBE_TEST_MARKER": str(tmp_path)}
    ended = subprocess.Popen(["true"], start_new_session=True)
    ended.wait()
    unused_group = ended.pid  # its group ended with it
    started: list[subprocess.Popen] = []

    def pause(seconds: float) -> None:
        started.append(subprocess.Popen(["sleep", "5"], env=env))
        assert eventually(lambda: processgroup.members(unused_group, marker) != [])

    monkeypatch.setattr(processgroup, "time", SimpleNamespace(sleep=pause, monotonic=time.monotonic))
    try:
        assert processgroup.members(unused_group, marker) == []
        found = processgroup.settled_members(unused_group, marker)
    finally:
        for process in started:
            process.kill()
            process.wait()
    assert len(started) == 1, "there was no second look"
    assert [m.split(" ", 1)[1] for m in found] == ["sleep 5 (outside its process group)"]


# Each process starts the next and ends (after $1 seconds), until the stop file ($0) appears: a
# listing of /proc can miss all of them, the one it listed having ended and the next started after.
# The delay is passed on to each call: inside a function, $1 is the function's own argument.
CHAIN = 'h() { [ -e "$0" ] && exit; sleep "$1"; h "$1" & }; h "$1"'


@pytest.mark.parametrize("setsid", [False, True])
def test_a_chain_of_processes_that_start_and_end_while_proc_is_read_is_never_taken_for_none(
    tmp_path: Path, setsid: bool
) -> None:
    # Before: a look often found nothing, and the probe's directory went while the chain ran.
    stop, marker = tmp_path / "stop", f"EVAL_PROBE_TEST_MARKER={tmp_path}"
    env = {**os.environ, "EVAL_PROBE_TEST_MARKER": str(tmp_path)}
    # Outside the group, a process is found by its marker only where a look shows it alive: each
    # then lives 20 ms, enough to be seen once; after that its own group is watched, exactly.
    shell = ["setsid", "bash", "-c", CHAIN, str(stop), "0.02"] if setsid else ["bash", "-c", CHAIN, str(stop), "0"]
    leader = subprocess.Popen(shell, start_new_session=True, env=env)
    followed: set[int] = set()
    try:
        if setsid:
            assert eventually(lambda: processgroup.members(leader.pid, marker, followed) != [])
            assert len(followed) == 1
        looks = [processgroup.members(leader.pid, marker, followed) for _ in range(40)]
        assert all(looks), f"{sum(1 for look in looks if not look)} of 40 looks found nothing"
        assert all(m.endswith("(outside its process group)") for look in looks for m in look) == setsid
    finally:
        stop.touch()
    assert eventually(lambda: processgroup.members(leader.pid, marker, followed) == [])
    leader.wait()


def test_members_skips_zombies_of_a_group_and_the_remover_does_not_wait_for_them(tmp_path: Path) -> None:
    # A group whose only process left is a zombie nobody reaps: nothing runs there any more.
    site = tmp_path / "site"
    site.mkdir()
    leader = subprocess.Popen(["sleep", "0.1"], start_new_session=True)
    try:
        assert eventually(lambda: not alive(leader.pid))  # a zombie: not reaped yet
        assert processgroup.members(leader.pid) == []
        processgroup.remove_when_empty(leader.pid, site)
        assert eventually(lambda: not site.exists(), 10), "the remover waited on a zombie"
    finally:
        leader.wait()


# eval-probe run in-process, with a signal sent to it at one moment of its work (``when``): while it
# prepares the probe, just before the command is started, or while the summary is written.
SIGNAL_AT = """
import os, signal, subprocess, sys
from probe import run as module
when, scratch = sys.argv[1], sys.argv[2]
real_popen, real_summary, real_text = subprocess.Popen, module.summary, module.sitecustomize_text
def text(*args, **kwargs):
    if when == "while-preparing":
        os.kill(os.getpid(), signal.SIGTERM)
    return real_text(*args, **kwargs)
def popen(*args, **kwargs):
    if when == "before-start" and args[0][0] == "bash":
        os.kill(os.getpid(), signal.SIGTERM)
    return real_popen(*args, **kwargs)
def summary(*args, **kwargs):
    if when == "during-summary":
        os.kill(os.getpid(), signal.SIGTERM)
    return real_summary(*args, **kwargs)
module.subprocess.Popen, module.summary, module.sitecustomize_text = popen, summary, text
# A sleep of its own for each case: another case may run beside it (pytest-xdist).
shell = "exit 0" if when == "during-summary" else f"sleep 30.2{len(when)} & wait"
sys.exit(module.run(["bash", "-c", shell], os.path.join(scratch, "r")))
"""


@pytest.mark.parametrize("when", ["while-preparing", "before-start", "during-summary"])
def test_a_signal_at_any_moment_leaves_nothing_behind(tmp_path: Path, when: str) -> None:
    # Before: the handlers were installed only once the command had started and removed before the
    # summary, so SIGTERM there killed eval-probe at once: its probe directory stayed in TMPDIR.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.run([PYTHON, "-c", SIGNAL_AT, when, str(scratch)], env=offline_env(None, TMPDIR=str(scratch)),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert probe_sites(tmp_path) == [], proc.stderr
    assert "Traceback" not in proc.stderr
    if when == "while-preparing":
        assert proc.returncode == 128 + signal.SIGTERM and "arrived before the command started" in proc.stderr
        assert "probe active" not in proc.stderr
    elif when == "before-start":
        assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
        assert "summary:" in proc.stderr and "SIGTERM" in proc.stderr
    else:
        assert proc.returncode == 0 or proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert not [line for line in running() if f"sleep 30.2{len(when)}" in line]


def running() -> list[str]:
    """The command line of every process here (those that end while listed are left out)."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def test_a_signal_ends_a_command_that_is_stopped(tmp_path: Path) -> None:
    # A stopped process handles SIGTERM only once continued. Before: eval-probe forwarded SIGTERM
    # and waited forever on the stopped command (`timeout` in a pipeline never ended it).
    proc = runner(tmp_path, 'echo ready; kill -STOP $$; echo "continued"; sleep 30')
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "continued" not in out and "ended by signal 15" in err


def test_the_summary_never_says_did_not_trip_while_what_it_started_still_runs(tmp_path: Path) -> None:
    # Before: "the probe did not trip and wrote no report: no lm-eval model it watches ran under it"
    # while the backgrounded lm-eval had barely started (and went on to trip).
    proc = runner(tmp_path, "sleep 3 &")
    _, err = proc.communicate(timeout=30)
    [summary] = [line for line in err.splitlines() if line.startswith("[lm-eval-probe] summary:")]
    assert "did not trip" not in summary and "not known yet" in summary, summary
    assert "eval-probe read" in summary


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_ctrl_z_stops_the_command_and_fg_continues_it(tmp_path: Path) -> None:
    ticks = tmp_path / "ticks"
    proc = runner(tmp_path, f'while true; do echo x >> "{ticks}"; sleep 0.05; done')
    try:
        assert eventually(lambda: ticks.exists() and ticks.stat().st_size > 0)
        assert eventually(lambda: bool(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()))
        child = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])  # leads its group
        proc.send_signal(signal.SIGTSTP)  # what the terminal sends on Ctrl-Z
        assert eventually(lambda: _state(proc.pid) == "T" and _state(child) == "T")
        size = ticks.stat().st_size
        time.sleep(0.5)
        assert ticks.stat().st_size == size  # the command is paused, not generating on
        proc.send_signal(signal.SIGCONT)  # the shell's fg
        assert eventually(lambda: ticks.stat().st_size > size and _state(proc.pid) != "T")
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
