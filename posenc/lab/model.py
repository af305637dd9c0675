"""A small decoder-only language model whose position scheme is chosen by name.

Pre-LayerNorm blocks (attention, then an MLP, each on ``x + f(LN(x))``), a final LayerNorm and
an output layer tied to the token embedding, as in GPT-2. One position scheme (see
``posenc.schemes``) is shared by every block: the ``embed`` hook acts once on the token
embeddings, ``rotate`` and ``bias`` act inside each attention layer. ``scheme`` may instead be a
list with one name per layer (iRoPE, as Llama 4: ``["rope", "rope", "rope", "nope"]``); a NoPE
layer given ``floor_scale`` and ``attn_scale`` scales its queries by Llama 4's attention
temperature (:func:`~posenc.temperature.llama4_attn_scale`), and a RoPE layer given ``attention_chunk``
attends only within chunks of that many tokens, as Llama 4's RoPE layers do. Nothing else changes
between schemes, so a difference in loss is a difference of position scheme.

Token embeddings start as ``N(0, 1/dim)`` for every scheme. The scheme-specific settings a fair
comparison needs live in :func:`scheme_kwargs`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_float, check_int, check_positions, check_tensor, is_compiling
from ..attention import MultiHeadAttention
from ..cache import KVCache, LayerCaches
from ..positions import packed_positions
from ..schemes import SCHEMES, PositionScheme, RoPE, make_scheme
from ..temperature import llama4_attn_scale

LAYER_SCHEMES = ("rope", "alibi", "t5", "nope")
"""The schemes a per-layer list may hold, those that act inside attention (no ``embed`` hook)."""


class TemperedNoPE(PositionScheme):
    """NoPE whose queries at position ``m`` are multiplied by Llama 4's attention temperature
    ``1 + attn_scale * log(1 + floor((m + 1) / floor_scale))`` (no rotation, no bias)."""

    def __init__(self, *, floor_scale: float, attn_scale: float) -> None:
        super().__init__()
        self.floor_scale = check_float("floor_scale", floor_scale, positive=True)
        self.attn_scale = check_float("attn_scale", attn_scale, minimum=0.0)

    def rotate(
        self, q: Tensor, k: Tensor, positions: Tensor, key_positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        s = llama4_attn_scale(positions, floor_scale=self.floor_scale, attn_scale=self.attn_scale)
        s = s[:, None] if s.dim() == 1 else s[:, None, :, None]  # [L, 1] or [B, 1, L, 1]
        return (q * s.to(q.device)).to(q.dtype), k

    def extra_repr(self) -> str:
        return f"floor_scale={self.floor_scale}, attn_scale={self.attn_scale}"


class ChunkedRoPE(RoPE):
    """RoPE in chunked attention, as Llama 4's RoPE layers: a query at position ``m`` sees only
    the keys of its own chunk, ``n // chunk == m // chunk`` (and ``n <= m``)."""

    def __init__(self, head_dim: int, *, attention_chunk: int, **kwargs) -> None:
        super().__init__(head_dim, **kwargs)
        self.chunk = check_int("attention_chunk", attention_chunk, minimum=1)

    def bias(self, q_len: int, k_len: int, *, causal: bool = True) -> Tensor:
        dev = self.rotary.inv_freq.device
        i = torch.arange(k_len - q_len, k_len, device=dev) // self.chunk  # queries: the last q_len
        j = torch.arange(k_len, device=dev) // self.chunk
        out = torch.zeros(1, q_len, k_len, device=dev)  # [1, Lq, Lk]
        return out.masked_fill(i[:, None] != j[None, :], float("-inf"))

    def position_bias(self, q_pos: Tensor, k_pos: Tensor, *, causal: bool = True) -> Tensor:
        same = (q_pos[:, :, None] // self.chunk) == (k_pos[:, None, :] // self.chunk)  # [B, Lq, Lk]
        zero = torch.zeros(same.shape, device=same.device)
        return zero.masked_fill(~same, float("-inf"))[:, None]  # [B, 1, Lq, Lk]

    def extra_repr(self) -> str:
        return f"attention_chunk={self.chunk}"


def layer_scheme(name: str, *, dim: int, num_heads: int, max_len: int | None, **kwargs) -> PositionScheme:
    """``make_scheme``, plus NoPE with temperature tuning when ``floor_scale``/``attn_scale`` are
    given, and RoPE in chunked attention when ``attention_chunk`` is given (Llama 4's layers)."""
    if name == "rope" and "attention_chunk" in kwargs:
        return ChunkedRoPE(dim // num_heads, **kwargs)
    if name == "nope" and kwargs:
        unknown = sorted(set(kwargs) - {"floor_scale", "attn_scale"})
        if unknown:
            raise ValueError(f"scheme 'nope' takes floor_scale and attn_scale, got {unknown}")
        return TemperedNoPE(floor_scale=kwargs.get("floor_scale", 8192.0),
                            attn_scale=kwargs.get("attn_scale", 0.1))
    return make_scheme(name, dim=dim, num_heads=num_heads, max_len=max_len, causal=True, **kwargs)


def scheme_kwargs(scheme: str, *, train_len: int) -> dict:
    """The per-scheme settings of a fair comparison, given the training length.

    * ``sinusoidal``: the table is added to the token embeddings as they are (``scale=False``).
      Vaswani et al. multiply the embeddings by ``sqrt(dim)`` first; in this small model that
      gives a *higher* in-distribution loss (chapter 6 measures both), so the fair choice is
      the one that trains better.
    * ``t5``: ``max_distance = train_len``: every distance the model will meet past training
      falls into the last bucket, which training has reached. (With the default 128 and a
      training length of 64, the buckets for distances 64-127 would stay at their random
      initialisation and be used only at test time.)
    * the others need nothing: RoPE uses base 10000, ALiBi the paper's slopes, learned absolute
      gets ``max_len`` rows from :class:`ModelConfig`, NoPE has nothing to set.
    """
    if scheme == "sinusoidal":
        return {"scale": False}
    if scheme == "t5":
        return {"max_distance": max(int(train_len), 17)}  # > num_buckets // 2 = 16 (causal)
    return {}


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a :class:`TransformerLM`. ``max_len`` matters only to ``"learned"`` (its rows).

    ``scheme`` is a name, or a list of ``num_layers`` names from :data:`LAYER_SCHEMES` (one per
    layer); then ``scheme_kwargs`` maps a name to its keyword arguments.
    """

    scheme: str | tuple[str, ...] = "alibi"
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: int = 4
    vocab_size: int = 256
    max_len: int | None = None
    scheme_kwargs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("dim", "num_layers", "num_heads", "mlp_ratio", "vocab_size"):
            check_int(name, getattr(self, name), minimum=1)
        if isinstance(self.scheme, list | tuple):
            object.__setattr__(self, "scheme", check_layer_schemes(self.scheme, self.num_layers))
        elif self.scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {self.scheme!r}; allowed: {', '.join(SCHEMES)}")
        if self.dim % self.num_heads:
            raise ValueError(f"dim={self.dim} must be divisible by num_heads={self.num_heads}")
        if self.max_len is not None:
            check_int("max_len", self.max_len, minimum=1)
        if self.scheme == "learned" and self.max_len is None:
            raise ValueError("scheme 'learned' needs max_len (the number of position rows)")
        if not isinstance(self.scheme_kwargs, dict):
            raise TypeError(f"scheme_kwargs must be a dict, got {type(self.scheme_kwargs).__name__}")

    def to_dict(self) -> dict:
        return asdict(self)


def check_layer_schemes(schemes: list | tuple, num_layers: int) -> tuple[str, ...]:
    """A per-layer scheme list as a tuple, or a ``ValueError`` naming what is wrong."""
    bad = [s for s in schemes if s not in LAYER_SCHEMES]
    if bad:
        raise ValueError(
            f"a per-layer scheme list may hold {', '.join(LAYER_SCHEMES)} (schemes without an embed "
            f"hook), got {bad}"
        )
    if len(schemes) != num_layers:
        raise ValueError(f"scheme lists {len(schemes)} layers but num_layers={num_layers}")
    return tuple(schemes)


class Block(nn.Module):
    """``x + attn(LN(x))``, then ``x + mlp(LN(x))``."""

    def __init__(self, config: ModelConfig, scheme: PositionScheme) -> None:
        super().__init__()
        d = config.dim
        self.ln1 = nn.LayerNorm(d)  # [B, L, d] -> [B, L, d]
        # q, k, v [B, H, L, d / H] inside; [B, L, d] in and out
        self.attn = MultiHeadAttention(d, config.num_heads, scheme=scheme, causal=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(  # [B, L, d] -> [B, L, mlp_ratio d] -> [B, L, d]
            nn.Linear(d, config.mlp_ratio * d), nn.GELU(), nn.Linear(config.mlp_ratio * d, d)
        )

    def forward(
        self, x: Tensor, positions: Tensor | None, cache: KVCache | None, **visibility: Tensor | None
    ) -> Tensor:
        """``x + attn(LN(x))``, then ``+ mlp(LN(.))``: ``x [B, L, dim]`` in, ``[B, L, dim]`` out;
        ``positions``, ``cache`` and ``attention_mask`` / ``document_ids`` go to the attention
        layer unchanged."""
        x = x + self.attn(self.ln1(x), positions=positions, cache=cache, **visibility)  # [B, L, dim]
        return x + self.mlp(self.ln2(x))  # [B, L, dim]: [B, L, 4 dim] inside the MLP


class TransformerLM(nn.Module):
    """Decoder-only byte (or token) language model: ``tokens [B, L] -> logits [B, L, vocab]``.

    ``TransformerLM(ModelConfig(...))`` or ``TransformerLM(scheme="rope", dim=64, ...)``.
    """

    def __init__(self, config: ModelConfig | None = None, **kwargs) -> None:
        super().__init__()
        if config is None:
            config = ModelConfig(**kwargs)
        elif kwargs:
            raise TypeError("pass either a ModelConfig or keyword arguments, not both")
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        d = config.dim
        self.embed = nn.Embedding(config.vocab_size, d)
        shape: dict[str, Any] = {"dim": d, "num_heads": config.num_heads, "max_len": config.max_len}
        if isinstance(config.scheme, str):
            self.scheme = layer_scheme(config.scheme, **shape, **config.scheme_kwargs)
            layers = [self.scheme] * config.num_layers
        else:  # one scheme per layer; layers with the same name share one instance
            self.scheme = PositionScheme()  # no embed hook: nothing to add to the input
            made = {n: layer_scheme(n, **shape, **config.scheme_kwargs.get(n, {}))
                    for n in dict.fromkeys(config.scheme)}
            layers = [made[n] for n in config.scheme]
        self.blocks = nn.ModuleList(Block(config, layers[i]) for i in range(config.num_layers))
        for i, block in enumerate(self.blocks):  # errors name the block: a cache serves one layer
            attn = cast(Block, block).attn
            attn.layer_name = f"{attn.layer_name} (blocks.{i}.attn)"
        self.ln_f = nn.LayerNorm(d)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 style: weights ``N(0, 0.02)``, residual outputs scaled by ``1/sqrt(2 layers)``,
        token embeddings ``N(0, 1/dim)`` (they are also the output layer)."""
        std = 0.02
        for name, p in self.named_parameters():
            if name.startswith("scheme.") or ".scheme." in name:
                continue  # the scheme initialises its own parameters
            if p.dim() == 2:
                out_proj = name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight")
                nn.init.normal_(p, std=std / math.sqrt(2 * self.config.num_layers) if out_proj else std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        nn.init.normal_(self.embed.weight, std=self.config.dim**-0.5)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        tokens: Tensor,
        *,
        positions: Tensor | None = None,
        caches: Sequence[KVCache] | None = None,
        attention_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """Logits ``[B, L, vocab_size]`` (the parameters' dtype) for ``tokens [B, L]``
        (integers in ``[0, vocab_size)``).

        ``positions`` (``[L]`` or ``[B, L]``, non-negative integers) default to ``arange(L)``
        after whatever the ``caches`` (a :class:`~posenc.cache.LayerCaches`, or any sequence of
        one :class:`~posenc.cache.KVCache` per block, each a different cache) already
        hold; the caches are extended in place, so decoding token by token gives the logits of
        one full pass. ``attention_mask [B, T]`` (1 = real token, cached plus new) and
        ``document_ids [B, L]`` (packed rows; positions then restart per document) go to every
        attention layer (:func:`~posenc.attention.attend`); give ``positions`` from
        :func:`~posenc.positions.positions_from_mask` with a left-padded batch.

        Raises:
            TypeError: ``tokens`` is not an integer tensor ``[B, L]``, ``positions`` not an
                integer tensor.
            ValueError: a token id is outside ``[0, vocab_size)``; ``caches`` does not hold one
                cache per block, or holds one cache twice; ``positions`` has the wrong shape or a
                negative entry, or a position is past a learned table's ``max_len``.
        """
        check_tensor("tokens", tokens)
        if tokens.is_floating_point() or tokens.dtype == torch.bool or tokens.dim() != 2:
            raise TypeError(
                f"tokens must be an integer tensor [B, L], got dtype {tokens.dtype}, "
                f"shape {tuple(tokens.shape)}"
            )
        if not is_compiling() and tokens.numel() and (
            int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size
        ):
            raise ValueError(
                f"tokens must lie in [0, {self.config.vocab_size - 1}] (vocab_size), got values from "
                f"{int(tokens.min())} to {int(tokens.max())}"
            )
        if caches is not None:
            self._check_caches(caches)
        given = positions  # None: attention keeps its default positions (and cached masks)
        if positions is None:
            L = tokens.shape[1]
            if document_ids is not None and not caches:
                positions = packed_positions(document_ids)  # [B, L]: what attention will use
            else:
                positions = (caches[0].next_positions(L, tokens.device) if caches
                             else torch.arange(L, device=tokens.device))  # [L]
        check_positions("positions", positions)
        x = self.scheme.embed(self.embed(tokens), positions)  # [B, L, D]
        for i, block in enumerate(self.blocks):
            x = block(x, given, caches[i] if caches else None,
                      attention_mask=attention_mask, document_ids=document_ids)
        return self.ln_f(x) @ self.embed.weight.T  # [B, L, vocab]

    def _check_caches(self, caches: object) -> None:
        """One distinct :class:`~posenc.cache.KVCache` per block."""
        if not isinstance(caches, Sequence) or isinstance(caches, str):
            raise TypeError(
                f"caches must be a LayerCaches or a list of one KVCache per block, got "
                f"{type(caches).__name__}"
            )
        if len(caches) != len(self.blocks):
            raise ValueError(
                f"caches must hold one KVCache per block ({len(self.blocks)}), got {len(caches)}; "
                f"posenc.LayerCaches({len(self.blocks)}) makes them"
            )
        for i, c in enumerate(caches):
            if not isinstance(c, KVCache):
                raise TypeError(f"caches[{i}] must be a KVCache, got {type(c).__name__}")
            for j in range(i):
                if caches[j] is c:
                    raise ValueError(
                        f"caches[{j}] and caches[{i}] are the same KVCache: a cache serves one "
                        f"layer (blocks.{j}.attn and blocks.{i}.attn would share keys); "
                        f"posenc.LayerCaches({len(self.blocks)}) makes one per block"
                    )

    def loss(self, tokens: Tensor, targets: Tensor, *, reduction: str = "mean") -> Tensor:
        """Cross-entropy (nats) of ``targets [B, L]`` given ``tokens [B, L]``."""
        logits = self(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
        loss = loss.view(targets.shape)
        return loss.mean() if reduction == "mean" else loss

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, *, temperature: float = 0.0) -> Tensor:
        """Continue ``prompt [B, L]`` by ``max_new_tokens`` with a KV cache (greedy at
        ``temperature=0``); returns ``[B, L + max_new_tokens]``."""
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
        temperature = check_float("temperature", temperature, minimum=0.0)
        caches = LayerCaches(len(self.blocks))
        out, nxt = prompt, prompt
        for _ in range(max_new_tokens):
            logits = self(nxt, caches=caches)[:, -1].float()  # [B, vocab]
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                nxt = torch.multinomial((logits / temperature).softmax(-1), 1)
            out = torch.cat([out, nxt], dim=1)
        return out
