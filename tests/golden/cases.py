"""The golden battery (issue 33, "Proof that nothing changed"): named calls into posenc's public
API whose results are recorded once at a base commit (``python tests/golden/record.py``) and
compared bit for bit by ``tests/test_golden.py`` after every commit.

Each case is a function returning ``dict[str, Tensor | str]``: outputs, gradients, a cache's
public state after each step, ``"TypeName: message"`` for an exception, ``"Category: message"``
for a warning. Every case draws its inputs from its own seeded generator, so cases do not
depend on the order they run in.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

import posenc
import posenc.hf
from posenc import (
    ALiBi,
    KVCache,
    LayerCaches,
    MultiHeadAttention,
    NoPE,
    RoPE,
    T5Bias,
    attend,
    streaming_keep,
)
from posenc.varlen import attend_varlen

Result = dict[str, object]
CASES: dict[str, Callable[[], Result]] = {}

B, H, D = 2, 4, 16
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}


def case(name: str, into: dict[str, Callable[[], Result]] | None = None
         ) -> Callable[[Callable[[], Result]], Callable[[], Result]]:
    """Register a case under ``name`` in ``into`` (default: this battery's ``CASES``)."""
    registry = CASES if into is None else into

    def put(fn: Callable[[], Result]) -> Callable[[], Result]:
        assert name not in registry, name
        registry[name] = fn
        return fn
    return put


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def scheme(name: str, seed: int = 7) -> posenc.PositionScheme:
    """A fresh scheme (no mask cached from an earlier case)."""
    if name == "nope":
        return NoPE()
    if name == "rope_i":
        return RoPE(D, interleaved=True)
    if name == "rope_h":
        return RoPE(D, interleaved=False)
    if name == "rope_py":
        return RoPE(D, interleaved=False, partial_rotary_factor=0.5, scaling=YARN)
    if name == "xpos":
        return RoPE(D, xpos_scale_base=64)
    if name == "alibi":
        return ALiBi(H)
    if name in ("t5c", "t5b"):
        s = T5Bias(H, bidirectional=name == "t5b", num_buckets=8, max_distance=16)
        with torch.no_grad():
            s.rel.embedding.weight.copy_(randn(gen(seed), *s.rel.embedding.weight.shape))
        return s
    raise KeyError(name)


SCHEMES = ["nope", "rope_i", "rope_h", "rope_py", "xpos", "alibi", "t5c", "t5b"]
BACKENDS = ["sdpa", "math", "flex"]


def error(fn: Callable[[], object]) -> str | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the golden records whatever is raised
        return f"{type(e).__name__}: {e}"
    return None


def run(fn: Callable[[], Result]) -> Result:
    """One case with fresh once-only warning state; the warnings it gives are recorded."""
    for name, mod in list(sys.modules.items()):
        if name.startswith("posenc") and isinstance(getattr(mod, "_warned", None), set):
            mod._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001
            out = {"error": f"{type(e).__name__}: {e}"}
    for i, w in enumerate(caught):
        out[f"warning{i}"] = f"{w.category.__name__}: {w.message}"
    return out


# ------------------------------------------------------------------------------ layouts


def layout(name: str, g: torch.Generator, dtype: torch.dtype, L: int = 8) -> tuple:
    """(q, k, v, keyword arguments) for a layout."""
    q = randn(g, B, H, L, D, dtype=dtype)
    kv_heads, dv, Lk, kw = H, D, L, {}
    if name == "gqa":
        kv_heads = 2
    elif name == "mqa":
        kv_heads = 1
    elif name == "vdim":
        dv = 8
    elif name == "keypos":  # the queries are the last shard of the keys
        Lk = 2 * L
        kw = {"positions": torch.arange(L, 2 * L), "key_positions": torch.arange(2 * L)}
    elif name.startswith("pad_"):
        m = torch.ones(B, L, dtype=torch.bool)
        if name == "pad_left":
            m[0, :3] = False
        elif name == "pad_right":
            m[1, -4:] = False
        else:
            m[0, 2] = m[0, 5] = m[1, 6] = False
        kw = {"attention_mask": m}
    elif name in ("mask3d", "mask4d"):
        shape = (B, L, L) if name == "mask3d" else (B, 1, L, L)
        m = torch.rand(*shape, generator=g) > 0.4
        m |= torch.eye(L, dtype=torch.bool)
        kw = {"attention_mask": m}
    elif name == "docs":
        kw = {"document_ids": torch.tensor([[0] * 4 + [1] * (L - 4), [0] * 7 + [2] * (L - 7)])}
    elif name == "window":
        kw = {"window": 4}
    elif name == "window_sinks":
        kw = {"window": 4, "sinks": 2}
    elif name == "noncausal":
        kw = {"causal": False}
    k = randn(g, B, kv_heads, Lk, D, dtype=dtype)
    v = randn(g, B, kv_heads, Lk, dv, dtype=dtype)
    return q, k, v, kw


LAYOUTS = ["plain", "gqa", "mqa", "vdim", "keypos", "pad_left", "pad_right", "pad_holes",
           "mask3d", "mask4d", "docs", "window", "window_sinks", "noncausal"]


def attend_case(s: str, lay: str, backend: str, dtype: torch.dtype = torch.float32,
                grad: bool = False, seed: int = 0, **extra: object) -> Callable[[], Result]:
    def fn() -> Result:
        g = gen(seed)
        q, k, v, kw = layout(lay, g, dtype)
        sch = scheme(s)
        opts = dict(extra)
        if "sink_logits" in opts:
            opts["sink_logits"] = randn(g, H).requires_grad_(grad)
        if grad:
            for t in (q, k, v):
                t.requires_grad_(True)
        out = attend(q, k, v, sch, backend=backend, **kw, **opts)
        res: Result = {"out": out.detach()}
        if grad:
            (out * randn(g, *out.shape, dtype=out.dtype)).sum().backward()
            res |= {"dq": q.grad, "dk": k.grad, "dv": v.grad}
            if isinstance(sch, T5Bias):
                res["dtable"] = sch.rel.embedding.weight.grad
            if "sink_logits" in opts:
                res["dsink"] = opts["sink_logits"].grad
        return res
    return fn


# every scheme in every layout (sdpa, float32)
for _s in SCHEMES:
    for _l in LAYOUTS:
        case(f"attend/{_s}/{_l}/sdpa/f32")(attend_case(_s, _l, "sdpa"))
# every scheme on math and flex, plain and a padded layout
for _s in SCHEMES:
    for _l in ("plain", "pad_holes"):
        case(f"attend/{_s}/{_l}/math/f32")(attend_case(_s, _l, "math"))
# flex compiles on CPU (20-40 s a case at the base): too slow for a 30 s test, so the
# battery holds only one flex case, one that does not compile
case("attend/t5c/window_sinks/flex/f32")(attend_case("t5c", "window_sinks", "flex"))
# every layout on math (T5, causal) and flex (ALiBi)
for _l in LAYOUTS:
    if _l not in ("plain", "pad_holes"):
        case(f"attend/t5c/{_l}/math/f32")(attend_case("t5c", _l, "math"))
# softmax options
for _s in ("nope", "rope_h", "alibi"):
    for _b in ("sdpa", "math"):
        case(f"attend/{_s}/plain/{_b}/f32/scale")(attend_case(_s, "plain", _b, scale=0.3))
        case(f"attend/{_s}/plain/{_b}/f32/softcap")(attend_case(_s, "plain", _b, softcap=2.0))
        case(f"attend/{_s}/window/{_b}/f32/sink_logits")(
            attend_case(_s, "window", _b, sink_logits=True))
# bfloat16
for _s in SCHEMES:
    for _b in ("sdpa", "math"):
        case(f"attend/{_s}/plain/{_b}/bf16")(attend_case(_s, "plain", _b, torch.bfloat16))
for _l in ("gqa", "pad_left", "docs", "window_sinks"):
    case(f"attend/rope_h/{_l}/sdpa/bf16")(attend_case("rope_h", _l, "sdpa", torch.bfloat16))
# one backward per path
for _s in SCHEMES:
    for _b in ("sdpa", "math"):
        case(f"grad/{_s}/plain/{_b}")(attend_case(_s, "plain", _b, grad=True))
for _l in ("gqa", "pad_holes", "docs", "window_sinks", "mask4d"):
    case(f"grad/t5c/{_l}/sdpa")(attend_case("t5c", _l, "sdpa", grad=True))
for _b in ("sdpa", "math"):
    case(f"grad/alibi/window/{_b}/sink_logits")(
        attend_case("alibi", "window", _b, grad=True, sink_logits=True))
    case(f"grad/rope_h/plain/{_b}/softcap")(attend_case("rope_h", "plain", _b, grad=True,
                                                        softcap=2.0))

# ------------------------------------------------------------------------------- dropout


def dropout_case(backend: str) -> Callable[[], Result]:
    def fn() -> Result:
        q, k, v, _ = layout("plain", gen(3), torch.float32)
        torch.manual_seed(1234)
        a = attend(q, k, v, scheme("rope_h"), backend=backend, dropout_p=0.3)
        b = attend(q, k, v, scheme("alibi"), backend=backend, dropout_p=0.5)
        return {"a": a, "b": b}
    return fn


for _b in ("sdpa", "math"):
    case(f"dropout/{_b}")(dropout_case(_b))


@case("dropout/mha")
def _dropout_mha() -> Result:
    torch.manual_seed(5)
    m = MultiHeadAttention(64, 4, scheme="rope", dropout=0.25).train()
    x = randn(gen(4), B, 10, 64)
    torch.manual_seed(6)
    return {"out": m(x).detach()}


# ------------------------------------------------------------------------------- caches

STATE = ["k", "v", "positions", "document_ids", "filled", "seen", "next_start", "valid",
         "evicted", "rows_agree", "owner", "max_len", "sinks", "window"]


def state(cache: KVCache, prefix: str) -> Result:
    """The cache's public state: tensors as they are, everything else as its repr."""
    res: Result = {f"{prefix}.len": repr(len(cache)), f"{prefix}.static": repr(cache.static),
                   f"{prefix}.rolling": repr(cache.rolling)}
    for name in STATE:
        value = getattr(cache, name, "<absent>")
        res[f"{prefix}.{name}"] = value.clone() if isinstance(value, Tensor) else repr(value)
    return res


def decode_case(kind: str, s: str, backend: str, full: bool = True,
                keep: Callable[[int], Tensor] | None = None) -> Callable[[], Result]:
    """A prefill then decode steps; ``full``: the cache's state after every step too (else
    the outputs and the final state only, to keep the fixture small). A growing cache evicts
    after each step to ``keep(len(cache))`` (default: ``streaming_keep``'s sinks 2, window 7)."""

    def state(cache: KVCache, prefix: str) -> Result:
        return globals()["state"](cache, prefix) if full or prefix == "reset2" else {}

    def fn() -> Result:
        g = gen(11)
        sch = scheme(s)
        if kind == "growing":
            cache = KVCache()
        elif kind == "static":
            cache = KVCache(max_len=20)
        else:
            cache = KVCache(max_len=2 + 6, sinks=2, window=6)
        opts = {"window": 6, "sinks": 2} if kind in ("growing", "rolling") else {}
        res: Result = {}
        L0 = 12 if kind != "static" else 8
        pad = torch.ones(B, L0, dtype=torch.bool)
        pad[0, :2] = False
        q, k, v = (randn(g, B, H if i == 0 else 2, L0, D) for i in range(3))
        res["out0"] = attend(q, k, v, sch, cache=cache, backend=backend, attention_mask=pad,
                             **opts)
        res |= state(cache, "s0")
        steps = 20 if kind != "static" else 6
        for i in range(1, steps + 1):
            q, k, v = (randn(g, B, H if j == 0 else 2, 1, D) for j in range(3))
            res[f"out{i}"] = attend(q, k, v, sch, cache=cache, backend=backend, **opts)
            if kind == "growing" and keep is not None:
                cache.evict(keep(len(cache)))
            elif kind == "growing":
                kept, _ = streaming_keep(len(cache), 2, 7)  # 0.4.0: window is attention's (issue 34)
                cache.evict(kept)
            res |= state(cache, f"s{i}")
        if kind == "static":
            cache.crop(10)
            res |= state(cache, "crop")
            q, k, v = (randn(g, B, H if j == 0 else 2, 2, D) for j in range(3))
            res["after_crop"] = attend(q, k, v, sch, cache=cache, backend=backend)
            cache.select(torch.tensor([1, 1]))
            res |= state(cache, "select")
            q, k, v = (randn(g, B, H if j == 0 else 2, 1, D) for j in range(3))
            res["after_select"] = attend(q, k, v, sch, cache=cache, backend=backend)
            cache.reset()
            res |= state(cache, "reset")
            res["after_reset"] = attend(q, k, v, sch, cache=cache, backend=backend)
            res |= state(cache, "reset2")
        if not full:
            res |= globals()["state"](cache, "final")
        return res
    return fn


for _kind in ("growing", "static", "rolling"):
    for _s, _b in [("rope_h", "sdpa"), ("alibi", "math")]:
        case(f"cache/{_kind}/{_s}/{_b}")(decode_case(_kind, _s, _b))
    case(f"cache/{_kind}/t5c/sdpa")(decode_case(_kind, "t5c", "sdpa", full=False))


@case("cache/layer_caches")
def _layer_caches() -> Result:
    torch.manual_seed(21)
    layers = [MultiHeadAttention(64, 4, num_kv_heads=2, scheme="rope") for _ in range(2)]
    caches = LayerCaches(2, max_len=16)
    g = gen(22)
    res: Result = {"repr0": repr(caches)}
    x = randn(g, B, 6, 64)
    for step in range(5):
        h = x
        for i, layer in enumerate(layers):
            h = layer(h, cache=caches[i])
            res |= state(caches[i], f"s{step}.l{i}")
        res[f"out{step}"] = h.detach()
        x = randn(g, B, 1, 64)
    caches.crop(7)
    res |= state(caches[1], "crop.l1")
    caches.select([1, 0])
    res |= state(caches[0], "select.l0")
    caches.reset()
    res |= state(caches[0], "reset.l0")
    res["repr1"] = repr(caches)
    return res


# ------------------------------------------------------------------------------- varlen


def varlen_case(s: str, backend: str, lengths: list[int], kv: int = 2, **kw: object
                ) -> Callable[[], Result]:
    def fn() -> Result:
        g = gen(31)
        total = sum(lengths)
        q, k, v = randn(g, total, H, D), randn(g, total, kv, D), randn(g, total, kv, D)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        return {"out": attend_varlen(q, k, v, scheme(s), cu_seqlens=cu, backend=backend, **kw)}
    return fn


for _s in ("nope", "rope_h", "alibi"):
    for _b in ("sdpa", "math"):
        case(f"varlen/{_s}/{_b}")(varlen_case(_s, _b, [5, 0, 9, 5, 3]))
        case(f"varlen/{_s}/{_b}/window")(varlen_case(_s, _b, [7, 0, 12], window=3))
case("varlen/rope_i/sdpa/noncausal_scale")(
    varlen_case("rope_i", "sdpa", [4, 6, 0], kv=4, causal=False, scale=0.2))

# ------------------------------------------------------------------------ MultiHeadAttention


def mha_case(s: str, **kw: object) -> Callable[[], Result]:
    def fn() -> Result:
        torch.manual_seed(41)
        m = MultiHeadAttention(64, 4, scheme=s, **kw).eval()
        x = randn(gen(42), B, 10, 64)
        pad = torch.ones(B, 10, dtype=torch.bool)
        pad[1, :3] = False
        return {"out": m(x).detach(), "padded": m(x, attention_mask=pad).detach()}
    return fn


for _s in ("nope", "rope", "alibi", "t5", "sinusoidal"):
    case(f"mha/{_s}")(mha_case(_s))
case("mha/rope/gqa_window")(mha_case("rope", num_kv_heads=2, window=4, sinks=1))
case("mha/alibi/math")(mha_case("alibi", backend="math"))

# -------------------------------------------------------------------------- posenc.hf.use

HF_FAMILIES = ["llama", "mistral", "gemma2", "gpt_oss"]
HF_SCHEMES: list[str | None] = [None, "alibi", "t5", "nope", "rope"]


def hf_model(family: str) -> torch.nn.Module:
    import transformers as tf

    common = {"vocab_size": 48, "hidden_size": 32, "intermediate_size": 48,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1,
              "eos_token_id": None, "tie_word_embeddings": False, "head_dim": 8}
    if family == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**common))
    if family == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(**common, sliding_window=4))
    if family == "gemma2":
        return tf.Gemma2ForCausalLM(tf.Gemma2Config(
            **common, query_pre_attn_scalar=8, attn_logit_softcapping=4.0, sliding_window=4))
    return tf.GptOssForCausalLM(tf.GptOssConfig(
        **common, sliding_window=4, num_local_experts=2, num_experts_per_tok=1,
        rope_parameters=YARN | {"rope_theta": 10000.0, "beta_fast": 32.0, "beta_slow": 1.0}))


def hf_case(family: str, s: str | None) -> Callable[[], Result]:
    def fn() -> Result:
        torch.manual_seed(51)
        model = hf_model(family).eval()
        model = posenc.hf.use(model, s)
        if s == "t5":
            with torch.no_grad():
                for p in model.posenc_scheme.parameters():
                    p.copy_(randn(gen(52), *p.shape))
        ids = torch.randint(2, 48, (B, 12), generator=gen(53))
        mask = torch.ones(B, 12, dtype=torch.long)
        mask[1, :4] = 0
        packed = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
        with torch.no_grad():
            return {
                "logits": model(input_ids=ids).logits,
                "left_padded": model(input_ids=ids, attention_mask=mask).logits,
                "packed": model(input_ids=ids[:1], position_ids=packed).logits,
            }
    return fn


for _f in HF_FAMILIES:
    for _s in HF_SCHEMES:
        case(f"hf/{_f}/{_s}")(hf_case(_f, _s))

# ----------------------------------------------------------------------------- bad input


def bad_input() -> dict[str, Callable[[], object]]:
    g = gen(61)
    q, k, v = randn(g, 1, 4, 5, D), randn(g, 1, 4, 5, D), randn(g, 1, 4, 5, D)
    nope = NoPE()
    grid: dict[str, Callable[[], object]] = {
        "q_list": lambda: attend(q.tolist(), k, v),
        "q_3d": lambda: attend(q[0], k, v),
        "q_int": lambda: attend(q.long(), k, v),
        "qk_dim": lambda: attend(q, k[..., :8], v),
        "qk_batch": lambda: attend(q, k.expand(2, -1, -1, -1), v),
        "kv_len": lambda: attend(q, k, v[:, :, :4]),
        "heads_3": lambda: attend(q, k[:, :3], v[:, :3]),
        "dtype_mix": lambda: attend(q, k.double(), v),
        "scheme_str": lambda: attend(q, k, v, "rope"),
        "causal_yes": lambda: attend(q, k, v, causal="yes"),
        "backend_bad": lambda: attend(q, k, v, backend="cuda"),
        "backend_int": lambda: attend(q, k, v, backend=1),
        "window_0": lambda: attend(q, k, v, window=0),
        "window_float": lambda: attend(q, k, v, window=2.5),
        "sinks_no_window": lambda: attend(q, k, v, sinks=2),
        "sinks_neg": lambda: attend(q, k, v, window=2, sinks=-1),
        "dropout_2": lambda: attend(q, k, v, dropout_p=2.0),
        "scale_str": lambda: attend(q, k, v, scale="1"),
        "softcap_0": lambda: attend(q, k, v, softcap=0.0),
        "sink_logits_shape": lambda: attend(q, k, v, sink_logits=torch.zeros(3)),
        "mask_float_2d": lambda: attend(q, k, v, attention_mask=torch.ones(1, 5)),
        "mask_shape": lambda: attend(q, k, v, attention_mask=torch.ones(1, 4, dtype=torch.bool)),
        "mask_5d": lambda: attend(q, k, v, attention_mask=torch.ones(1, 1, 1, 5, 5).bool()),
        "mask_4d_heads": lambda: attend(q, k, v, attention_mask=torch.ones(1, 3, 5, 5).bool()),
        "positions_float": lambda: attend(q, k, v, positions=torch.arange(5.0)),
        "positions_len": lambda: attend(q, k, v, positions=torch.arange(4)),
        "key_positions_len": lambda: attend(q, k, v, key_positions=torch.arange(3)),
        "doc_ids_shape": lambda: attend(q, k, v, document_ids=torch.zeros(1, 4, dtype=torch.long)),
        "doc_ids_float": lambda: attend(q, k, v, document_ids=torch.zeros(1, 5)),
        "cu_seqlens_attend": lambda: attend(q, k, v, cu_seqlens=torch.tensor([0, 5])),
        "cache_type": lambda: attend(q, k, v, cache={}),
        "cache_heads": lambda: (attend(q, k, v, nope, cache=(c := KVCache())),
                                attend(q, k[:, :2], v[:, :2], nope, cache=c)),
        "cache_dim": lambda: (attend(q, k, v, nope, cache=(c := KVCache())),
                              attend(q, k[..., :8], v, nope, cache=c)),
        "static_overflow": lambda: attend(q, k, v, nope, cache=KVCache(max_len=3)),
        "kvcache_max_len_0": lambda: KVCache(max_len=0),
        "kvcache_sinks_only": lambda: KVCache(max_len=4, sinks=2),
        "rolling_wrong_window": lambda: attend(q, k, v, nope, window=3, sinks=2,
                                               cache=KVCache(max_len=6, sinks=2, window=4)),
        "crop_neg": lambda: (attend(q, k, v, nope, cache=(c := KVCache())), c.crop(-1)),
        "select_oob": lambda: (attend(q, k, v, nope, cache=(c := KVCache())), c.select([3])),
        "evict_bad": lambda: (attend(q, k, v, nope, cache=(c := KVCache())),
                              c.evict(torch.tensor([9]))),
        "streaming_keep_bad": lambda: streaming_keep(5, -1, 2),
        "layer_caches_index": lambda: LayerCaches(2)[5],
        "varlen_cu_float": lambda: attend_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1),
                                                 v[0].transpose(0, 1),
                                                 cu_seqlens=torch.tensor([0.0, 5.0])),
        "varlen_cu_short": lambda: attend_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1),
                                                 v[0].transpose(0, 1),
                                                 cu_seqlens=torch.tensor([0, 3])),
        "varlen_backend": lambda: attend_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1),
                                                v[0].transpose(0, 1), backend="nope",
                                                cu_seqlens=torch.tensor([0, 5])),
        "mha_heads": lambda: MultiHeadAttention(30, 4),
        "mha_scheme": lambda: MultiHeadAttention(64, 4, scheme="bogus"),
        "mha_kv_heads": lambda: MultiHeadAttention(64, 4, num_kv_heads=3),
        "mha_backend": lambda: MultiHeadAttention(64, 4, backend="fast"),
        "hf_use_bad_scheme": lambda: posenc.hf.use(torch.nn.Linear(2, 2), "bogus"),
        "make_scheme_bad": lambda: posenc.make_scheme("bogus"),
        "rope_odd": lambda: RoPE(7),
    }
    return grid


@case("bad_input")
def _bad_input() -> Result:
    return {name: str(error(fn)) for name, fn in bad_input().items()}
