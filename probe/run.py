"""``eval-probe run -- COMMAND``: run any command (typically lm_eval) with the probe active."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from probe.inject import sitecustomize_text
from probe.reader.sidecar import read_sidecar
from probe.runtime.contract import ENV_REPORT, RESULT_DIR_VARS
from probe.runtime.log import PREFIX

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def output_path_in(command: list[str]) -> str | None:
    """The value of lm_eval's ``--output_path`` (or ``-o``) in ``command``, if any."""
    for i, word in enumerate(command):
        for flag in ("--output_path", "--output-path", "-o"):
            if word == flag and i + 1 < len(command):
                return command[i + 1]
            if word.startswith(flag + "="):
                return word.split("=", 1)[1]
    return None


def run(command: list[str], result_dir: str | None = None) -> int:
    """Run ``command`` with the probe, then print a short verdict; returns its exit code.

    The probe lives in a temporary sitecustomize.py directory put first on PYTHONPATH
    (it chains any sitecustomize.py it shadows) and removed in every case. Signals sent
    to this process (Ctrl-C included) are passed on to the command.
    """
    chosen = result_dir or output_path_in(command)
    result = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix="eval-probe-results-"))
    result = result.resolve()
    site = Path(tempfile.mkdtemp(prefix="eval-probe-site-"))
    report = site / "observed.json"
    try:
        (site / "sitecustomize.py").write_text(sitecustomize_text(chain=True), encoding="utf-8")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
        env[RESULT_DIR_VARS[0]] = str(result)
        env[ENV_REPORT] = str(report)
        _say(f"probe active; sidecar and results go to {result}")
        code = _run_forwarding_signals(command, env)
        _say(summary(result, report))
        return code
    finally:
        shutil.rmtree(site, ignore_errors=True)


def _run_forwarding_signals(command: list[str], env: dict[str, str]) -> int:
    try:
        # Its own session: a terminal's Ctrl-C reaches it once, through us, not twice.
        child = subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as error:
        _say(f"cannot start {command[0]!r}: {error.strerror}")
        return 127
    previous = {sig: signal.signal(sig, lambda number, _frame: child.send_signal(number)) for sig in _FORWARDED}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def summary(result_dir: Path, report: Path) -> str:
    """The summary line: what the sidecar's trip record says, or that the probe did not trip and
    what it saw."""
    sidecar = read_sidecar(result_dir)
    if sidecar.state == "unreadable":
        return f"summary: the sidecar is unreadable ({sidecar.error})"
    if sidecar.state == "valid":
        v = sidecar.trip
        cut = sidecar.final.get("short_circuited_requests") if sidecar.final else "?"
        return (
            f"summary: TRIPPED ({v['pathology']}): {v['pathological']}/{v['observations']} generations hit the "
            f"max_tokens cap {v['max_tokens']}; {cut} requests short-circuited. Sidecar: {sidecar.path}. "
            f"Next: eval-probe read {result_dir}"
        )
    try:
        observed = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "summary: the probe did not trip, and no lm-eval model it watches ran under it (nothing observed)"
    groups = observed.get("groups", [])
    seen = sum(g["observations"] for g in groups)
    bad = sum(g["pathological"] for g in groups)
    return (
        f"summary: the probe did not trip: {bad} of {seen} generations observed ended at the cap, "
        f"in {len(groups)} group(s) of generation settings"
    )


def _say(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)
