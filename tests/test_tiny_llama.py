"""Tiny Llamas of scripts/tiny_llama.py whose answers depend on the prompt: the ``countdown``
variant, the healthy model that ``benchmarks/bench_healthy.py --server vllm`` serves, whose
answer lengths it sets prompt by prompt, and the ``echo`` variant, which stops or loops by the
prompt's last character. Checked with transformers' greedy decoding, in the Hugging Face
environment."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.hf import SCRIPTS, hf_python
from support.hf import tiny_llama as build_model

sys.path.insert(0, str(SCRIPTS))
from tiny_llama import CHAIN, CHAIN_LENGTH, countdown_prompt

pytestmark = [pytest.mark.hf, pytest.mark.release_independent]

LENGTHS = (1, 2, 37)  # generated; every length up to CHAIN_LENGTH - 1 at once, teacher-forced

# Greedy answers from the model at argv[1]: answers(prompts, most) gives, for each prompt, the
# tokens it generated (at most ``most``), whether the last was EOS, and the text.
_ANSWERS = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])

def answers(prompts, most):
    found = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")
        new = model.generate(**ids, max_new_tokens=most, do_sample=False)[0, ids["input_ids"].shape[1]:]
        found.append({"tokens": len(new), "eos": new[-1].item() == tokenizer.eos_token_id,
                      "text": tokenizer.decode(new, skip_special_tokens=True)})
    return found
"""

_GENERATE = (
    _ANSWERS
    + """
prompts, whole = json.loads(sys.argv[2]), sys.argv[3]
found = answers(prompts, 2100)
ids = tokenizer(whole, return_tensors="pt")["input_ids"]
with torch.no_grad():
    picks = model(ids).logits[0].argmax(-1)
# What makes the teacher-forced picks a generation's: attention, the only part that reads other
# positions, writes nothing (its output projection is zero), so a position's logits are its token's.
silent = all(not layer.self_attn.o_proj.weight.any() for layer in model.model.layers)
print(json.dumps({"answers": found, "ids": ids[0].tolist(), "picks": picks.tolist(), "eos": tokenizer.eos_token_id,
                  "layers_add_nothing": silent}))
"""
)


def test_a_countdown_prompt_for_n_is_answered_with_n_chain_tokens_then_eos(tmp_path_factory) -> None:
    model = build_model("countdown", tmp_path_factory)
    prompts = [countdown_prompt(n, f"Item {n}, go on: ") for n in LENGTHS]
    # The longest answer's prompt followed by that answer: greedy decoding picks the most likely
    # token at each position, and no position reads another (a token's logits are its own), so
    # the picks after every chain character are what a generation of any length from it makes.
    whole = countdown_prompt(CHAIN_LENGTH - 1, "Go on: ") + "".join(CHAIN[1:])
    run = subprocess.run(
        [hf_python(), "-c", _GENERATE, str(model), json.dumps(prompts), whole],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out = json.loads(run.stdout.splitlines()[-1])
    assert [(a["tokens"], a["eos"], a["text"]) for a in out["answers"]] == [
        (n + 1, True, "".join(CHAIN[-n:])) for n in LENGTHS
    ]
    assert out["layers_add_nothing"]
    chain = out["ids"][-CHAIN_LENGTH:]  # one token a character
    assert len(set(chain)) == CHAIN_LENGTH
    assert out["picks"][-CHAIN_LENGTH:] == [*chain[1:], out["eos"]]
    assert len(set("".join(CHAIN))) == CHAIN_LENGTH  # the text never repeats a character


@pytest.mark.parametrize("n", [0, CHAIN_LENGTH, -3])
def test_a_countdown_length_outside_the_chain_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match="countdown answer has 1 to"):
        countdown_prompt(n)


_ECHO = (
    _ANSWERS
    + """
print(json.dumps(answers(json.loads(sys.argv[2]), 12)))
"""
)


def test_the_echo_model_repeats_a_prompts_last_character_but_after_a_tilde_or_a_bang(tmp_path_factory) -> None:
    # What the vLLM and Hugging Face tests that run it rely on: the stopping and the looping
    # answers of one model, told apart by the prompt alone.
    model = build_model("echo", tmp_path_factory)
    prompts = ["What is 1 + 2?\nAnswer:", "abc x", "xyz~", "What is 1 + 2?\nAnswer!"]
    run = subprocess.run([hf_python(), "-c", _ECHO, str(model), json.dumps(prompts)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    found = [(a["text"], a["eos"]) for a in json.loads(run.stdout.splitlines()[-1])]
    assert found == [(":" * 12, False), ("x" * 12, False), ("", True), ("~", True)]
