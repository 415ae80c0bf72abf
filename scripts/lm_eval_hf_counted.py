"""Run lm-eval's command line in this process, counting what ``transformers`` generated.

With lm-eval's Hugging Face backend (``--model hf``) there is no server to count tokens for
us. This counts every ``generate`` call of ``transformers`` (``GenerationMixin.generate``):
the decoding steps times the rows of the batch (what the model computed: a row that has
stopped still occupies its place until its batch ends), and writes them as JSON when lm-eval
ends, whatever its outcome, then exits with lm-eval's exit status:

    python scripts/lm_eval_hf_counted.py COUNTS.json -- --model hf --model_args ... --tasks ...

``{"generate_calls": N, "batch_rows": R, "generated_tokens": T, "prompt_positions": P,
"padding_positions": D}``: P is rows times the batch's padded prompt width, D the padding in
it (the attention mask's zeros), what a batch of prompts of unequal lengths costs.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        sys.exit(__doc__)
    counts_file = Path(sys.argv[1])
    sys.argv = ["lm_eval", *sys.argv[3:]]
    import transformers

    names = ("generate_calls", "batch_rows", "generated_tokens", "prompt_positions", "padding_positions")
    counts = dict.fromkeys(names, 0)
    original = transformers.GenerationMixin.generate

    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = original(self, *args, **kwargs)
        prompt = kwargs.get("input_ids", args[0] if args else None)
        counts["generate_calls"] += 1
        counts["batch_rows"] += output.shape[0]
        counts["generated_tokens"] += output.shape[0] * (output.shape[1] - prompt.shape[1])
        counts["prompt_positions"] += prompt.shape[0] * prompt.shape[1]
        mask = kwargs.get("attention_mask")
        if mask is not None:
            counts["padding_positions"] += int((mask == 0).sum())
        return output

    transformers.GenerationMixin.generate = generate
    try:
        runpy.run_module("lm_eval", run_name="__main__", alter_sys=True)
    finally:
        counts_file.write_text(json.dumps(counts))


if __name__ == "__main__":
    main()
