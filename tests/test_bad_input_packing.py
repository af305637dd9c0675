"""Wrong calls of the packing helpers (issues 21 and 26 §3): each raises naming the argument,
the value and what is allowed, and a description of a packed batch given in place of another
names the converter. ``test_bad_input_coverage`` counts these ``CASES``."""

from __future__ import annotations

import pytest
import torch

from posenc import cu_seqlens, document_ids_from_lengths, document_ids_from_positions, packed_positions

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
]


@pytest.mark.parametrize(
    "name, call, exc, text", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_wrong_call_raises_naming_the_argument(name, call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value)
