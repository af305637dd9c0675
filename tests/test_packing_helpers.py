"""Packing as it runs (issue 21): ``document_ids``, restarting positions and FlashAttention's
``cu_seqlens`` convert into each other, and agree with the pinned transformers.

``document_ids_from_positions`` is checked against ``masking_utils.find_packed_sequence_indices``
and ``cu_seqlens`` against ``prepare_fa_kwargs_from_position_ids`` and
``DataCollatorWithFlattening``, on random packed batches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import cu_seqlens, document_ids_from_positions, packed_positions

transformers = pytest.importorskip("transformers")
from transformers import DataCollatorWithFlattening  # noqa: E402
from transformers.masking_utils import find_packed_sequence_indices  # noqa: E402
from transformers.modeling_flash_attention_utils import (  # noqa: E402
    prepare_fa_kwargs_from_position_ids,
)

# a row is a list of document lengths; a batch is rows of the same total length
lengths = st.lists(st.integers(1, 7), min_size=1, max_size=6)


@st.composite
def packed_batch(draw) -> tuple[torch.Tensor, list[list[int]]]:
    """``document_ids [B, L]`` with arbitrary (not sorted, not from 0) ids, and the lengths."""
    L = draw(st.integers(1, 24))
    B = draw(st.integers(1, 4))
    rows, ids = [], []
    for _ in range(B):
        lens, left = [], L
        while left:
            n = draw(st.integers(1, left))
            lens.append(n)
            left -= n
        names = draw(st.lists(st.integers(-50, 50), min_size=len(lens), max_size=len(lens),
                              unique=True))
        rows.append(lens)
        ids.append([name for name, n in zip(names, lens, strict=True) for _ in range(n)])
    return torch.tensor(ids), rows


def transformers_doc_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``find_packed_sequence_indices``, with its ``None`` (no packing) spelled out as zeros."""
    got = find_packed_sequence_indices(position_ids)
    return torch.zeros_like(position_ids) if got is None else got


@given(packed_batch(), st.sampled_from([0, 2]))
def test_document_ids_from_positions_equals_transformers(batch, start):
    doc, _ = batch
    pos = packed_positions(doc) + start  # [B, L]; 2 = RoBERTa-like padding_idx + 1
    ours = document_ids_from_positions(pos)
    assert ours.dtype == torch.long and ours.shape == doc.shape
    assert torch.equal(ours, transformers_doc_ids(pos))


@given(packed_batch(), st.integers(1, 40))
def test_a_row_may_start_mid_document_as_transformers_computes(batch, shift):
    # a chunk that continues an earlier one: the row's first document starts past 0
    doc, _ = batch
    pos = packed_positions(doc)
    changes = (doc[:, 1:] != doc[:, :-1]).long().cumsum(-1)  # [B, L - 1]
    first = torch.cat([torch.zeros_like(doc[:, :1]), changes], -1) == 0  # [B, L]: first run
    pos = pos + shift * first
    assert (pos[:, 0] >= shift).all()
    assert torch.equal(document_ids_from_positions(pos), transformers_doc_ids(pos))


@given(packed_batch())
def test_cu_seqlens_equals_transformers_flash_attention_kwargs(batch):
    doc, _ = batch
    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(packed_positions(doc))
    cu, max_len = cu_seqlens(doc)
    assert cu.dtype == torch.int32 == cu_q.dtype
    assert torch.equal(cu, cu_q) and torch.equal(cu, cu_k)
    assert isinstance(max_len, int) and max_len == int(max_q) == int(max_k)


@given(packed_batch())
def test_round_trips(batch):
    doc, rows = batch
    pos = packed_positions(doc)
    back = document_ids_from_positions(pos)
    # the same partition: a document starts in ``back`` exactly where it starts in ``doc``
    assert torch.equal(back[:, 1:] != back[:, :-1], doc[:, 1:] != doc[:, :-1])
    assert torch.equal(back[:, 0], torch.zeros(doc.shape[0], dtype=torch.long))
    assert torch.equal(packed_positions(back), pos)
    cu, max_len = cu_seqlens(doc)
    flat = [n for lens in rows for n in lens]
    assert cu[0] == 0 and cu[-1] == doc.numel()
    assert cu.diff().tolist() == flat
    assert max_len == max(flat)
    assert torch.equal(cu_seqlens(back)[0], cu)
    # and from positions straight to transformers' offsets
    assert torch.equal(cu_seqlens(document_ids_from_positions(pos))[0],
                       prepare_fa_kwargs_from_position_ids(pos)[0][0])


@given(lengths)
def test_data_collator_with_flattening(lens):
    # the collator's one packed row: positions restart at 0, -100 is every sequence's first label
    features = [{"input_ids": list(range(10, 10 + n))} for n in lens]
    b = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(features)
    assert torch.equal(document_ids_from_positions(b["position_ids"]), b["seq_idx"].long())
    cu, max_len = cu_seqlens(b["seq_idx"])
    assert torch.equal(cu, b["cu_seq_lens_q"]) and max_len == b["max_length_q"]
    first = torch.zeros(sum(lens), dtype=torch.bool)
    first[cu[:-1].long()] = True
    assert (b["labels"][0][first] == -100).all() and (b["labels"][0][~first] != -100).all()


def test_one_row_int32_and_empty():
    pos = torch.tensor([0, 1, 2, 0, 1, 0], dtype=torch.int32)
    assert document_ids_from_positions(pos).tolist() == [0, 0, 0, 1, 1, 2]
    cu, max_len = cu_seqlens(torch.tensor([7, 7, 7, 3, 3, 9]))
    assert cu.tolist() == [0, 3, 5, 6] and max_len == 3
    assert document_ids_from_positions(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0)
    cu, max_len = cu_seqlens(torch.zeros(2, 0, dtype=torch.long))
    assert cu.tolist() == [0] and cu.dtype == torch.int32 and max_len == 0


def test_rows_are_separate_sequences():
    # one document per row: two sequences, not one across the rows
    cu, max_len = cu_seqlens(torch.tensor([[4, 4, 4], [4, 4, 4]]))
    assert cu.tolist() == [0, 3, 6] and max_len == 3


def test_document_ids_from_positions_compiles_without_graph_breaks():
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 3, 4]])
    fn = torch.compile(document_ids_from_positions, backend=counter, fullgraph=True)
    assert torch.equal(fn(pos), transformers_doc_ids(pos))
    assert counter.frame_count == 1


@pytest.mark.parametrize(
    ("pos", "text"),
    [
        ([[0, 1, 2, 5, 6]], "got 2 then 5 at index (0, 3)"),  # a jump
        ([0, 1, 1, 2], "got 1 then 1 at index 2"),  # a repeat
        ([0, 1, 2, 3, 2, 3], "got 3 then 2 at index 4"),  # falls back to 2, not to 0
        ([[0, 1, 2], [5, 6, 2]], "must restart at 0"),
    ],
)
def test_positions_transformers_splits_two_ways_are_refused(pos, text):
    pos = torch.tensor(pos)
    with pytest.raises(ValueError, match="position_ids must restart") as info:
        document_ids_from_positions(pos)
    assert text in str(info.value)
    # what the refusal protects against: the mask path and the FlashAttention path disagree
    (cu, _), _ = prepare_fa_kwargs_from_position_ids(pos)
    mask_docs = int((transformers_doc_ids(pos.reshape(-1, pos.shape[-1])).amax(-1) + 1).sum())
    assert len(cu) - 1 != mask_docs


@pytest.mark.parametrize(
    ("call", "exc", "text"),
    [
        (lambda: document_ids_from_positions(torch.tensor([0.0, 1.0])), TypeError,
         "position_ids must be an integer tensor, got dtype torch.float32"),
        (lambda: document_ids_from_positions(torch.tensor([True, False])), TypeError,
         "position_ids must be an integer tensor, got dtype torch.bool"),
        (lambda: document_ids_from_positions(torch.zeros(1, 2, 3, dtype=torch.long)), ValueError,
         "position_ids must have shape [L] or [B, L], got shape (1, 2, 3)"),
        (lambda: document_ids_from_positions(torch.tensor([[-1, 0, 1]])), ValueError,
         "position_ids must be >= 0, got a minimum of -1"),
        (lambda: document_ids_from_positions([0, 1, 2]), TypeError,
         "position_ids must be a torch.Tensor"),
        (lambda: cu_seqlens(torch.tensor([0.0, 0.0])), TypeError,
         "document_ids must be an integer tensor, got dtype torch.float32"),
        (lambda: cu_seqlens(torch.zeros(5, dtype=torch.long)[None, None]), ValueError,
         "document_ids must have shape [L] or [B, L], got shape (1, 1, 5)"),
        (lambda: cu_seqlens(torch.tensor([[0, 0, 1, 0]])), ValueError, "one contiguous run"),
        (lambda: cu_seqlens([[0, 0, 1]]), TypeError, "document_ids must be a torch.Tensor"),
    ],
)
def test_bad_input_names_the_argument(call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value)
