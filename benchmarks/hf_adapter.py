"""posenc's attention inside a transformers Llama (``posenc.hf.use``) against transformers' own.

    python benchmarks/hf_adapter.py [--repeats 20] [--threads 2] [--length 128] [--batch 8]
                                    [--only step packed]

Two tables, each from one run (calls timed round-robin, medians; ``benchmarks/_timing.py``).
The model is a tiny ``LlamaForCausalLM`` built from a config (hidden 128, 2 layers, 4 query
heads, 2 kv heads, a vocabulary of 512; random weights, no download), float32, training mode.

1. ``step``: forward + backward (the loss over every token) of a ``[batch, length]`` batch:
   transformers' ``sdpa`` vs posenc with the model's own RoPE (``use(model)``) and with ALiBi
   (``use(model, "alibi")``), without and with a left-padded mask (a quarter of the rows
   padded by a quarter). The logits of the first two agree (max |diff| printed).
2. ``packed``: one SFT step (forward + backward) on a ``DataCollatorWithFlattening`` row of
   documents of mixed lengths (seeded, 32-``length`` tokens, ``batch * length`` tokens in all):
   transformers' own packed path (``sdpa``, ``use_cache=False``, no mask: its mask path finds
   the documents in the restarting ``position_ids``) vs posenc (documents by FlashAttention's
   rule, the default ``use_cache``); the same documents padded into rows with transformers'
   ``sdpa`` for reference. Tokens/s counts the real tokens.
"""

from __future__ import annotations

import argparse
import copy
import random

import torch
from _timing import medians

import posenc
import posenc.hf


def _config(vocab: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=4096, pad_token_id=0,
        bos_token_id=1, eos_token_id=None, tie_word_embeddings=False,
    )


def _models(vocab: int) -> dict[str, torch.nn.Module]:
    """transformers' sdpa, posenc with the model's RoPE and posenc with ALiBi: one weight draw,
    each model from its own deep copy of the config (use() switches the config it is given)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaForCausalLM(copy.deepcopy(_config(vocab))).train()
    hf.set_attn_implementation("sdpa")
    out = {"transformers sdpa": hf}
    for name, scheme in (("posenc, model's RoPE", None), ("posenc, ALiBi", "alibi")):
        m = LlamaForCausalLM(copy.deepcopy(_config(vocab))).train()
        m.load_state_dict(hf.state_dict())
        out[name] = posenc.hf.use(m, scheme)
    assert len({id(m.config) for m in out.values()}) == len(out)
    return out


def _step(model: torch.nn.Module, **batch: torch.Tensor):
    def run() -> None:
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
    return run


def step_table(models: dict[str, torch.nn.Module], args) -> None:
    B, L, V = args.batch, args.length, args.vocab
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, V, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[: max(1, B // 4), : L // 4] = 0  # a quarter of the rows left-padded by a quarter
    padded_ids = ids.masked_fill(mask == 0, 0)
    labels = padded_ids.masked_fill(mask == 0, -100)
    hf, ours = models["transformers sdpa"], models["posenc, model's RoPE"]
    with torch.no_grad():
        diff = (hf(padded_ids, attention_mask=mask).logits
                - ours(padded_ids, attention_mask=mask).logits)[mask.bool()].abs().max()
    print(f"\n1. forward + backward, [{B}, {L}] (logits, padded, posenc vs transformers: "
          f"max |diff| {float(diff):.1e})")
    for title, batch in (("no mask", {"input_ids": ids, "labels": ids}),
                         ("left-padded", {"input_ids": padded_ids, "attention_mask": mask,
                                          "labels": labels})):
        t = medians({n: _step(m, **batch) for n, m in models.items()}, repeats=args.repeats)
        base = t["transformers sdpa"]
        print(f"   {title}:")
        for n, s in t.items():
            print(f"     {n:<24}{s * 1e3:9.1f} ms{s / base:8.2f}x")


def _documents(args) -> list[list[int]]:
    rnd = random.Random(2)
    docs, total = [], 0
    while total < args.batch * args.length:
        n = min(rnd.randint(32, args.length), args.batch * args.length - total)
        docs.append([rnd.randrange(2, args.vocab) for _ in range(max(n, 2))])
        total += len(docs[-1])
    return docs


def packed_table(models: dict[str, torch.nn.Module], args) -> None:
    from transformers import DataCollatorWithFlattening, DataCollatorWithPadding

    docs = _documents(args)
    flat = DataCollatorWithFlattening()([{"input_ids": d} for d in docs])
    pad = DataCollatorWithPadding(tokenizer=_PadOnly())([{"input_ids": d} for d in docs])
    pad_labels = pad["input_ids"].masked_fill(pad["attention_mask"] == 0, -100)
    real = sum(map(len, docs))
    hf, ours = models["transformers sdpa"], models["posenc, model's RoPE"]
    packed = {"input_ids": flat["input_ids"], "position_ids": flat["position_ids"],
              "labels": flat["labels"]}
    with torch.no_grad():
        diff = (hf(**packed, use_cache=False).logits - ours(**packed).logits).abs().max()
    fns = {
        "transformers sdpa, packed": _step(hf, **packed, use_cache=False),
        "posenc, model's RoPE, packed": _step(ours, **packed),
        "posenc, ALiBi, packed": _step(models["posenc, ALiBi"], **packed),
        "transformers sdpa, padded rows": _step(hf, input_ids=pad["input_ids"],
                                                attention_mask=pad["attention_mask"],
                                                labels=pad_labels),
    }
    t = medians(fns, repeats=args.repeats)
    base = t["transformers sdpa, packed"]
    print(f"\n2. packed SFT step: {len(docs)} documents, {real} tokens in one row "
          f"(padded: {tuple(pad['input_ids'].shape)}); posenc vs transformers packed: "
          f"max |diff| {float(diff):.1e}")
    for n, s in t.items():
        print(f"     {n:<32}{s * 1e3:9.1f} ms{s / base:8.2f}x{real / s:12.0f} tokens/s")


class _PadOnly:
    """The least a tokenizer must be for ``DataCollatorWithPadding``: pad ``input_ids``."""

    pad_token_id = 0
    padding_side = "right"
    model_input_names = ["input_ids", "attention_mask"]

    def pad(self, features, padding=True, max_length=None, pad_to_multiple_of=None,
            return_tensors="pt", **kwargs):
        L = max(len(f["input_ids"]) for f in features)
        ids = torch.zeros(len(features), L, dtype=torch.long)
        mask = torch.zeros(len(features), L, dtype=torch.long)
        for i, f in enumerate(features):
            ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
            mask[i, : len(f["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--only", nargs="+", choices=("step", "packed"), default=("step", "packed"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{args.threads} thread(s), medians of {args.repeats}")
    models = _models(args.vocab)
    if "step" in args.only:
        step_table(models, args)
    if "packed" in args.only:
        packed_table(models, args)


if __name__ == "__main__":
    main()
