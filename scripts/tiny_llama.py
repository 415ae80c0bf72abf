"""Build a tiny Llama locally (no download) that vLLM can serve, in eight variants.

- ``never_stop``: its output is one token, repeated forever; it never emits EOS or a
  stop sequence, so every request runs to ``max_tokens`` (``finish_reason: length``). Its
  output is the tightest loop there is (period one).
- ``never_stop_wide``: ``never_stop`` with a four-character token (``abcd``), about what
  a BPE token holds in English text: the loop detector, whose unit is a piece of at most four
  characters of a word, then sees one unit a token, where ``never_stop`` gives it one a
  quarter unit (its tokenizer is one character a token).
- ``babble``: under sampling (``temperature=1``) its output is random lowercase letters
  and spaces, each drawn uniformly and independently: it never stops (EOS, newlines and the
  rest of the vocabulary are e^-34 times less likely than a letter) and never loops. Under
  greedy decoding it is ``never_stop``.
- ``stops``: its output token is " 7" followed by a blank line, so lm-eval's stop
  sequence ends each answer after one token (``finish_reason: stop``) with the answer
  " 7": a healthy model that is right when the answer is 7.
- ``echo``: it repeats the last character of its prompt forever, except after ``~``, where
  it emits EOS at once, and after ``!``, where it answers ``~`` and stops: whether a
  generation ever stops depends on the prompt.
- ``think``: ``echo`` with ``<think>`` and ``</think>`` in its vocabulary (which vLLM's
  ``deepseek_r1`` reasoning parser needs) and a chat template that ends with the user's text:
  served with that parser, a chat answer that never emits ``</think>`` is all reasoning
  (content null), and one after ``~`` is empty.
- ``varied``: random weights, every one times 3, so its greedy text depends on the prompt
  and, in bfloat16, on the numerics of its batch (which prompts share it, the padding).
- ``countdown``: a healthy model whose answer lengths vary with the prompt, as a real
  model's do, and whose text never repeats: its vocabulary also holds a chain of
  ``CHAIN_LENGTH`` CJK characters, it continues the chain from the prompt's last character
  and emits EOS after the chain's last one, so the prompt :func:`countdown_prompt` makes for
  ``n`` gets an answer of exactly ``n`` tokens (``finish_reason: stop``) under greedy
  decoding.

How: the final RMSNorm's weight is zero, so every logit is exactly 0 and greedy
decoding picks token 0; ``never_stop``, ``never_stop_wide`` and ``stops`` differ only in which
string token 0 is. For
``babble`` every layer adds one constant vector through its MLP's bias (the embeddings and
every weight that reads its input are zero), so the last hidden state is the same at every
position, and the output head gives the allowed characters logit 0 and the others -34. For
``echo`` the layers add nothing (their output projections are zero), the embeddings are
orthonormal, and the output head is the embedding matrix, so the greedy pick is the current
token; its EOS row is twice ``~``'s embedding, and ``~``'s row adds twice ``!``'s.
``countdown`` is built the same way, with random unit embeddings (more tokens than
dimensions) and each chain character's output row the embedding of the one before it. The rest
(random weights, head size 64, a character-level vocabulary, a chat template) keeps
vLLM's CPU backend and lm-eval's chat path working. Run with the vLLM environment's
Python: ``python scripts/tiny_llama.py DIR --variant never_stop``; with several ``--variant``,
one process builds each into ``DIR/VARIANT`` (torch and transformers imported once).
"""

from __future__ import annotations

import argparse
import json
import string
from pathlib import Path

FIRST_TOKEN = {
    "never_stop": "a", "never_stop_wide": "abcd", "stops": " 7\n\n", "echo": "~", "babble": "a", "varied": "a",
    "countdown": "a", "think": "~",
}  # fmt: skip
BABBLE = set(string.ascii_lowercase + " ")  # what babble draws from: no stop sequence can form
BANNED_LOGIT = 34.0  # the babble head's logit for every other token, below the allowed ones
ECHO_STOP = "~"  # the echo variant's one character followed by EOS
ECHO_ANSWER = "!"  # the one it follows with ECHO_STOP: a stopping answer that is not empty
CHAIN_LENGTH = 2048  # the countdown variant's chain: its longest answer is one less
CHAIN = [chr(0x4E00 + i) for i in range(CHAIN_LENGTH)]  # CJK ideographs: no stop sequence, no loop
SPECIALS = ["<s>", "</s>", "<unk>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
THINK_SPECIALS = ["<think>", "</think>"]
THINK_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"  # ends in the user's text


def build(directory: Path, variant: str) -> Path:
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    first = FIRST_TOKEN[variant]
    chars = [c for c in string.printable if c != first] + (CHAIN if variant == "countdown" else [])
    think = variant == "think"
    vocab = {token: i for i, token in enumerate([first, *chars, *SPECIALS, *(THINK_SPECIALS if think else [])])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = THINK_TEMPLATE if think else CHAT_TEMPLATE

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 64: the CPU attention backend rejects 16
        num_key_value_heads=2,
        max_position_embeddings=8192,  # room for 4096-token answers after their prompt
        mlp_bias=variant == "babble",
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        pad_token_id=vocab["<pad>"],
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        if variant in ("echo", "think"):
            embeddings = torch.linalg.qr(torch.randn(config.hidden_size, len(vocab)))[0].T
            model.model.embed_tokens.weight.copy_(embeddings)
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            model.lm_head.weight.copy_(embeddings)
            model.lm_head.weight[vocab["</s>"]] = 2 * embeddings[vocab[ECHO_STOP]]
            model.lm_head.weight[vocab[ECHO_STOP]] += 2 * embeddings[vocab[ECHO_ANSWER]]
        elif variant == "countdown":
            _countdown(model, [vocab[c] for c in CHAIN], vocab["</s>"])
        elif variant == "babble":
            _babble(model, [token in BABBLE for token in vocab])
        elif variant == "varied":
            for parameter in model.parameters():
                parameter.mul_(3)  # sharper logits than the initialisation's: varied text
        else:
            model.model.norm.weight.zero_()  # every logit 0: greedy always picks token 0
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    fast.save_pretrained(directory)
    (directory / "tiny_llama_variant.json").write_text(json.dumps({"variant": variant, "token_0": first}))
    return directory


def countdown_prompt(n: int, lead: str = "") -> str:
    """A prompt, ``lead`` then a chain character, that the countdown variant answers in exactly
    ``n`` tokens (1 <= n < CHAIN_LENGTH): the rest of the chain, then EOS."""
    if not 1 <= n < CHAIN_LENGTH:
        raise ValueError(f"a countdown answer has 1 to {CHAIN_LENGTH - 1} tokens, not {n}")
    return lead + CHAIN[CHAIN_LENGTH - 1 - n]


def _countdown(model: object, chain: list[int], eos: int) -> None:
    """Make ``model`` continue ``chain`` from its current token, and end it with ``eos``."""
    import torch

    for layer in model.model.layers:  # the layers add nothing: the last hidden state is the token's
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    embeddings = torch.nn.functional.normalize(torch.randn(model.config.vocab_size, model.config.hidden_size), dim=1)
    model.model.embed_tokens.weight.copy_(embeddings)
    head = torch.zeros_like(embeddings)
    for here, after in zip(chain, [*chain[1:], eos], strict=True):
        head[after] = embeddings[here]
    model.lm_head.weight.copy_(head)
    # Greedy must pick the next one from every chain character: its logit is the embedding's
    # squared norm, every other a product of two random unit vectors (a few tenths at most).
    picked = (embeddings[chain] @ head.T).argmax(dim=1)
    if picked.tolist() != [*chain[1:], eos]:
        raise RuntimeError("the countdown chain is ambiguous at this hidden size; raise it")


def _babble(model: object, allowed: list[bool]) -> None:
    """Make ``model``'s logits constant: 0 where ``allowed``, -BANNED_LOGIT elsewhere."""
    import torch

    hidden = model.config.hidden_size
    for parameter in model.parameters():
        parameter.zero_()
    model.model.norm.weight.fill_(1.0)
    for layer in model.model.layers:
        layer.input_layernorm.weight.fill_(1.0)
        layer.post_attention_layernorm.weight.fill_(1.0)
        layer.mlp.down_proj.bias[0] = 1.0  # each layer adds e_0 to the residual stream
    # The last hidden state is then e_0 scaled to unit RMS: sqrt(hidden) in its first entry.
    banned = torch.tensor([0.0 if ok else -BANNED_LOGIT / hidden**0.5 for ok in allowed])
    model.lm_head.weight[:, 0] = banned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="the model's directory; with several variants, their parent")
    parser.add_argument("--variant", choices=sorted(FIRST_TOKEN), required=True, action="append")
    args = parser.parse_args()
    if len(args.variant) == 1:
        print(build(args.directory, args.variant[0]))
        return
    for variant in dict.fromkeys(args.variant):
        print(build(args.directory / variant, variant))


if __name__ == "__main__":
    main()
