"""Wrong calls of the packing helpers (issue 21): each raises naming the argument, the value and
what is allowed. ``test_bad_input_coverage`` counts these ``CASES``."""

from __future__ import annotations

import pytest
import torch

from posenc import cu_seqlens, document_ids_from_positions

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
]


@pytest.mark.parametrize(
    "name, call, exc, text", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_wrong_call_raises_naming_the_argument(name, call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value)
