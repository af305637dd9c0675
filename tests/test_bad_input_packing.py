"""Wrong calls of the packing helpers (issues 21 and 26 §3) and of varlen attention: each raises
naming the argument, the value and what is allowed, and a description of a packed batch given in
place of another names the converter. ``test_bad_input_coverage`` counts these ``CASES``."""

from __future__ import annotations

import pytest
import torch

from posenc import ALiBi, cu_seqlens, document_ids_from_lengths, document_ids_from_positions, packed_positions
from posenc.varlen import attend_varlen

Q, K, V = torch.randn(10, 4, 8), torch.randn(10, 2, 8), torch.randn(10, 2, 8)  # [total, H, D]
CU = torch.tensor([0, 4, 10], dtype=torch.int32)


def varlen(**kw):
    """``attend_varlen`` on the tensors above, ``kw`` replacing any argument."""
    args = {"q": Q, "k": K, "v": V, "cu_seqlens": CU, **kw}
    return attend_varlen(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("scheme", None), **args)


CASES = [
    ("document_ids_from_positions", lambda: document_ids_from_positions(torch.tensor([0.0, 1.0])),
     TypeError, "position_ids must be an integer tensor, got dtype torch.float32"),
    ("document_ids_from_positions", lambda: document_ids_from_positions(torch.zeros(1, 2, 3).long()),
     ValueError, "position_ids must have shape [L] or [B, L]"),
    ("document_ids_from_positions", lambda: document_ids_from_positions(torch.tensor([[-1, 0, 1]])),
     ValueError, "position_ids must be >= 0, got a minimum of -1"),
    ("document_ids_from_positions", lambda: document_ids_from_positions(torch.tensor([[0, 1, 3, 4]])),
     ValueError, "position_ids must restart at 0 (the smallest position) or go on by 1, got 1 then 3"),
    ("cu_seqlens", lambda: cu_seqlens(torch.tensor([0.0, 0.0])),
     TypeError, "document_ids must be an integer tensor, got dtype torch.float32"),
    ("cu_seqlens", lambda: cu_seqlens(torch.zeros(1, 1, 5, dtype=torch.long)),
     ValueError, "document_ids must have shape [L] or [B, L]"),
    ("cu_seqlens", lambda: cu_seqlens(torch.tensor([[0, 0, 1, 0]])),
     ValueError, "document_ids must hold each document as one contiguous run"),
    ("cu_seqlens", lambda: cu_seqlens([[0, 0, 1]]),
     TypeError, "document_ids must be a torch.Tensor, got list"),
    # issue 26 §3: padding dropped, lengths, and the likely mistake named
    ("cu_seqlens", lambda: cu_seqlens(torch.zeros(2, 5).long(), attention_mask=torch.ones(2, 4)),
     ValueError, "attention_mask must have the shape of document_ids, [2, 5] (1 = a real token), "
     "got shape (2, 4)"),
    ("cu_seqlens", lambda: cu_seqlens(torch.zeros(5).long(), attention_mask=torch.ones(2, 5)),
     ValueError, "attention_mask must have the shape of document_ids, [5] or [1, 5]"),
    ("cu_seqlens", lambda: cu_seqlens(torch.zeros(2, 5).long(), attention_mask=torch.full((2, 5), 2)),
     ValueError, "attention_mask must hold only 0 and 1 (1 = a real token), got values [2]"),
    ("cu_seqlens", lambda: cu_seqlens(torch.zeros(1, 5).long(), attention_mask=[[1] * 5]),
     TypeError, "attention_mask must be a torch.Tensor, got list"),
    ("cu_seqlens", lambda: cu_seqlens(torch.zeros(1, 2).long(), attention_mask=torch.ones(1, 2).cfloat()),
     TypeError, "attention_mask must be a bool, integer or float tensor of 0/1, got dtype torch.complex64"),
    ("cu_seqlens", lambda: cu_seqlens(torch.tensor([[0, 0, 1, 1, 0, 0]]), attention_mask=torch.ones(1, 6)),
     ValueError, "in row 0, 1 id(s) come back after another id"),
    ("cu_seqlens", lambda: cu_seqlens(torch.tensor([[0, 1, 2, 0, 1, 0]]), attention_mask=torch.ones(1, 6)),
     ValueError, "It looks like position_ids (runs counting up by 1 that restart at 0): "
     "posenc.document_ids_from_positions(position_ids) gives the document ids."),
    ("cu_seqlens", lambda: cu_seqlens(torch.tensor([[0, 1, 2, 0, 1, 0]])),
     ValueError, "posenc.document_ids_from_positions(position_ids) gives the document ids"),
    ("packed_positions", lambda: packed_positions(torch.tensor([0, 1, 2, 3, 0, 1, 0, 1, 2])),
     ValueError, "5 id(s) that come back after another id. It looks like position_ids"),
    ("packed_positions", lambda: packed_positions(torch.tensor([[2, 3, 4, 2, 3]])),
     ValueError, "It looks like position_ids (runs counting up by 1 that restart at 2)"),
    ("document_ids_from_lengths", lambda: document_ids_from_lengths([3, -1]),
     ValueError, "lengths[1] must be an int >= 0, got -1"),
    ("document_ids_from_lengths", lambda: document_ids_from_lengths([3, 2.0]),
     TypeError, "lengths[1] must be an int, got 2.0 (float)"),
    ("document_ids_from_lengths", lambda: document_ids_from_lengths([True, 2]),
     TypeError, "lengths[0] must be an int, got True (bool)"),
    ("document_ids_from_lengths", lambda: document_ids_from_lengths(torch.tensor([[1, 2]])),
     ValueError, "lengths must be 1-D (one length per document), got shape (1, 2)"),
    ("document_ids_from_lengths", lambda: document_ids_from_lengths(torch.tensor([1.0, 2.0])),
     TypeError, "lengths must be a list of ints or an integer tensor, got dtype torch.float32"),
    ("document_ids_from_lengths", lambda: document_ids_from_lengths(torch.tensor([2, -3])),
     ValueError, "lengths must be >= 0, got a minimum of -3"),
    ("document_ids_from_lengths", lambda: document_ids_from_lengths(5),
     TypeError, "lengths must be a list or tuple of ints or a 1-D integer tensor, got int "
     "(one document of 5 tokens: [5])"),
    ("document_ids_from_lengths", lambda: document_ids_from_lengths("3, 2"),
     TypeError, "got str"),
    # attend_varlen: flash-attn's layout, offsets, options
    ("attend_varlen", lambda: varlen(q=Q.transpose(0, 1)[None]),
     ValueError, "q must have flash-attn's varlen layout [total, H, D] (the sequences one after "
     "another), got the 4-D shape (1, 4, 10, 8), e.g. [B, H, L, D]: call posenc.attend("),
    ("attend_varlen", lambda: varlen(k=K[None]),
     ValueError, "k must have flash-attn's varlen layout [total, H, D]"),
    ("attend_varlen", lambda: varlen(q=Q[0]),
     ValueError, "q must have flash-attn's varlen layout [total, H, D], got shape (4, 8)"),
    ("attend_varlen", lambda: varlen(q=Q.long()),
     TypeError, "q must be a floating-point tensor"),
    ("attend_varlen", lambda: varlen(v=V.double()),
     TypeError, "q, k, v must share one dtype, got torch.float32, torch.float32, torch.float64"),
    ("attend_varlen", lambda: varlen(k=K[:9], v=V[:9]),
     ValueError, "q, k, v must be [total, H, D], [total, H_kv, D], [total, H_kv, Dv] (one total, "
     "k with q's head size), got (10, 4, 8), (9, 2, 8), (9, 2, 8)"),
    ("attend_varlen", lambda: varlen(k=torch.randn(10, 2, 6)),
     ValueError, "k with q's head size"),
    ("attend_varlen", lambda: varlen(k=torch.randn(10, 3, 8), v=torch.randn(10, 3, 8)),
     ValueError, "q has 4 heads and k/v have 3: the query heads must be a multiple of the kv heads"),
    ("attend_varlen", lambda: varlen(cu_seqlens=[0, 4, 10]),
     TypeError, "cu_seqlens must be a torch.Tensor of offsets (int32, as flash-attn takes), e.g. "
     "torch.tensor([0, 5, 8], dtype=torch.int32), got list"),
    ("attend_varlen", lambda: varlen(cu_seqlens=CU.float()),
     TypeError, "cu_seqlens must be an integer tensor (int32 or int64), got dtype torch.float32"),
    ("attend_varlen", lambda: varlen(cu_seqlens=torch.tensor([], dtype=torch.int32)),
     ValueError, "cu_seqlens must be 1-D [N + 1], the offsets [0, n_1, n_1 + n_2, ..., total], got "
     "shape (0,)"),
    ("attend_varlen", lambda: varlen(cu_seqlens=torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1]])),
     ValueError, "(a [B, L] tensor looks like document_ids: posenc.cu_seqlens(document_ids) gives "
     "the offsets)"),
    ("attend_varlen", lambda: varlen(cu_seqlens=torch.tensor([1, 4, 10])),
     ValueError, "cu_seqlens must start at 0 (offsets [0, n_1, n_1 + n_2, ..., total]), got [1, 4, 10]"),
    ("attend_varlen", lambda: varlen(cu_seqlens=torch.tensor([4, 6])),
     ValueError, "these look like the lengths (they sum to total = q.shape[0] = 10): the offsets "
     "are torch.cat([n.new_zeros(1), n.cumsum(0)])"),
    ("attend_varlen", lambda: varlen(cu_seqlens=torch.tensor([0, 6, 4, 10])),
     ValueError, "cu_seqlens must not decrease (the offsets of sequences one after another), got 6 "
     "then 4 at index 2"),
    ("attend_varlen", lambda: varlen(cu_seqlens=torch.tensor([0, 1, 2, 3, 0, 1, 2, 0, 1, 2])),
     ValueError, "It looks like position_ids (runs counting up by 1 that restart at 0): "
     "posenc.document_ids_from_positions(position_ids) gives the document ids, and "
     "posenc.cu_seqlens(document_ids) the offsets"),
    ("attend_varlen", lambda: varlen(cu_seqlens=torch.tensor([0, 4, 9])),
     ValueError, "cu_seqlens must end at total = q.shape[0] = 10 (every token in one sequence), "
     "got 9: [0, 4, 9]"),
    ("attend_varlen", lambda: varlen(cu_seqlens=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])),
     ValueError, "it has one entry per token and looks like document ids: "
     "posenc.cu_seqlens(document_ids) gives the offsets"),
    ("attend_varlen", lambda: varlen(max_seqlen=5),
     ValueError, "max_seqlen must be at least the longest sequence in cu_seqlens, 6, got 5"),
    ("attend_varlen", lambda: varlen(max_seqlen=6.0),
     TypeError, "max_seqlen must be an int, got 6.0 (float)"),
    ("attend_varlen", lambda: varlen(scale=0.0),
     ValueError, "scale must be > 0, got 0.0"),
    ("attend_varlen", lambda: varlen(scale="0.1"),
     TypeError, "scale must be a real number, got '0.1' (str)"),
    ("attend_varlen", lambda: varlen(scale=float("nan")),
     ValueError, "scale must be finite, got nan"),
    ("attend_varlen", lambda: varlen(scheme=ALiBi(2)),
     ValueError, "scheme 'alibi' has a bias for 2 heads but q has 4 heads; they must be equal"),
    ("attend_varlen", lambda: varlen(scheme=ALiBi),
     TypeError, "scheme must be a PositionScheme or None, got the class ALiBi; pass an instance, "
     "e.g. ALiBi(num_heads)"),
    ("attend_varlen", lambda: varlen(scheme="rope"),
     TypeError, "scheme must be a PositionScheme or None, got str"),
    ("attend_varlen", lambda: varlen(backend="flash"),
     ValueError, "backend must be one of ('sdpa', 'math', 'flex'), got 'flash'"),
    ("attend_varlen", lambda: varlen(window=0),
     ValueError, "window must be an int >= 1, got 0"),
    ("attend_varlen", lambda: varlen(causal="yes"),
     TypeError, "causal must be a bool (True or False), got 'yes' (str)"),
    ("attend_varlen", lambda: varlen(dropout_p=1.5),
     ValueError, "dropout_p must be in [0, 1], got 1.5"),
    ("attend_varlen", lambda: attend_varlen(Q, K, V),
     TypeError, "missing 1 required keyword-only argument: 'cu_seqlens'"),
]


@pytest.mark.parametrize(
    "name, call, exc, text", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_wrong_call_raises_naming_the_argument(name, call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value)
