#!/usr/bin/env bash
# Set up lm-eval-probe in .venv, then run the demo (no GPU, no model download).
# Arguments go to `eval-probe demo` (try --help).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh main
exec .venv/bin/eval-probe demo "$@"
