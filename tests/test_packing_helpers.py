"""Packing as it runs (issue 21): ``document_ids``, restarting positions and FlashAttention's
``cu_seqlens`` convert into each other, and agree with the pinned transformers.

``document_ids_from_positions`` is checked against ``masking_utils.find_packed_sequence_indices``
and ``cu_seqlens`` against ``prepare_fa_kwargs_from_position_ids`` and
``DataCollatorWithFlattening``, on random packed batches; ``cu_seqlens(..., attention_mask=)``
(issue 26 §3) against the collator and ``_get_unpad_data`` on padded rows."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import (
    cu_seqlens,
    document_ids_from_lengths,
    document_ids_from_positions,
    packed_positions,
)
from posenc.positions import _document_ids_hint

transformers = pytest.importorskip("transformers")
from transformers import DataCollatorWithFlattening  # noqa: E402
from transformers.masking_utils import find_packed_sequence_indices  # noqa: E402
from transformers.modeling_flash_attention_utils import (  # noqa: E402
    _get_unpad_data,
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


# -- cu_seqlens(attention_mask=): padding dropped (issue 26 §3) ---------------------------------


@st.composite
def padded_batch(draw) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``(document_ids [B, L], attention_mask [B, L], the documents' lengths in row-major
    order)``: rows of documents (ids unique in their row) with padding before, between and
    after them, the pads' ids drawn at random (often equal to a real document's)."""
    B = draw(st.integers(1, 4))
    rows, masks, lens = [], [], []
    for _ in range(B):
        docs = draw(st.lists(st.integers(1, 6), max_size=4))
        names = draw(st.lists(st.integers(-3, 9), min_size=len(docs), max_size=len(docs), unique=True))
        ids, mask = [], []
        for name, n in zip(names, docs, strict=True):
            pad = draw(st.integers(0, 3))
            ids += [draw(st.integers(-3, 9))] * pad + [name] * n
            mask += [0] * pad + [1] * n
        lens += docs
        rows.append(ids)
        masks.append(mask)
    L = max(len(r) for r in rows) + draw(st.integers(0, 3))
    left = draw(st.booleans())  # left or right padding up to L
    for ids, mask in zip(rows, masks, strict=True):
        pad, fill = L - len(ids), draw(st.integers(-3, 9))
        at = 0 if left else len(ids)
        ids[at:at] = [fill] * pad
        mask[at:at] = [0] * pad
    return torch.tensor(rows, dtype=torch.long).reshape(B, L), torch.tensor(masks).reshape(B, L), lens


@given(padded_batch(), st.sampled_from([torch.long, torch.int32, torch.bool, torch.float32]))
def test_cu_seqlens_drops_padding_as_the_collator_flattens(batch, mask_dtype):
    doc, mask, lens = batch
    cu, max_len = cu_seqlens(doc, attention_mask=mask.to(mask_dtype))
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == int(mask.sum())
    assert cu.diff().tolist() == lens and max_len == max(lens, default=0)
    if lens:  # the collator packs the real tokens of every document, in order, into one row
        features = [{"input_ids": list(range(100, 100 + n))} for n in lens]
        flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features)
        assert torch.equal(cu, flat["cu_seq_lens_q"]) and max_len == flat["max_length_q"]


@given(st.lists(st.integers(0, 8), min_size=1, max_size=5), st.booleans())
def test_cu_seqlens_of_one_document_per_row_equals_get_unpad_data(lens, left):
    # transformers' padded flash-attention path: one sequence per row, padding removed
    L = max(lens) + 1
    mask = torch.tensor([[0] * (L - n) + [1] * n if left else [1] * n + [0] * (L - n) for n in lens])
    doc = torch.arange(len(lens))[:, None].expand(-1, L)  # one id per row
    cu, max_len = cu_seqlens(doc, attention_mask=mask)
    _, want, want_max = _get_unpad_data(mask)
    # transformers keeps an empty row as a zero-length sequence (a repeated offset); here it adds none
    assert torch.equal(cu, torch.unique_consecutive(want)) and max_len == want_max
    if all(lens):
        assert torch.equal(cu, want)


def test_cu_seqlens_padding_examples():
    doc = torch.tensor([[0, 0, 1, 1, 1, 5], [2, 2, 2, 2, 5, 5]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    assert cu_seqlens(doc)[0].tolist() == [0, 2, 5, 6, 10, 12]  # the padded tails count
    cu, max_len = cu_seqlens(doc, attention_mask=mask)
    assert cu.tolist() == [0, 2, 5, 8] and max_len == 3
    # a pad id equal to a real document's, a pad inside a document, a fully padded row
    doc = torch.tensor([[3, 3, 3, 4, 4, 3], [1, 1, 1, 1, 1, 1], [9, 9, 9, 9, 9, 9]])
    mask = torch.tensor([[1, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 1, 1]])
    cu, max_len = cu_seqlens(doc, attention_mask=mask.bool())
    assert cu.tolist() == [0, 2, 4, 8] and max_len == 4
    # 1-D ids take a 1-D or a [1, L] mask; an all-zero mask gives no sequence
    ids = torch.tensor([0, 0, 1, 1, 1])
    for m in (torch.tensor([1, 1, 1, 1, 0]), torch.tensor([[1, 1, 1, 1, 0]])):
        assert cu_seqlens(ids, attention_mask=m)[0].tolist() == [0, 2, 4]
    cu, max_len = cu_seqlens(ids, attention_mask=torch.zeros(5))
    assert cu.tolist() == [0] and max_len == 0
    cu, max_len = cu_seqlens(torch.zeros(2, 0, dtype=torch.long), attention_mask=torch.zeros(2, 0))
    assert cu.tolist() == [0] and max_len == 0


def test_cu_seqlens_with_mask_is_unpad_inputs_layout():
    # q[mask] (flash-attn's unpad_input) split at the offsets gives each document's real tokens
    doc = torch.tensor([[5, 5, 6, 6, 6, 0, 0], [7, 7, 7, 7, 8, 8, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0]])  # left, then right padded
    doc[0, :2] = 0  # the left pads share the id of the row's last document
    doc[0, 5:] = 9
    x = torch.arange(doc.numel()).reshape(doc.shape)  # a token's flat index
    cu, _ = cu_seqlens(doc, attention_mask=mask)
    unpadded = x[mask.bool()]
    pieces = [unpadded[a:b].tolist() for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)]
    assert pieces == [[2, 3, 4], [5, 6], [7, 8, 9, 10], [11, 12]]


# -- document_ids_from_lengths -------------------------------------------------------------------


@given(st.lists(st.integers(0, 7), max_size=8), st.sampled_from(["list", "tuple", "int32", "int64"]))
def test_document_ids_from_lengths_round_trips(lens, kind):
    given_ = {"list": lens, "tuple": tuple(lens), "int32": torch.tensor(lens, dtype=torch.int32),
              "int64": torch.tensor(lens, dtype=torch.long)}[kind]
    ids = document_ids_from_lengths(given_)
    assert ids.dtype == torch.long and ids.shape == (sum(lens),)
    # document i is lengths[i] copies of i: an id names its place in ``lengths``
    assert ids.tolist() == [i for i, n in enumerate(lens) for _ in range(n)]
    cu, max_len = cu_seqlens(ids)
    assert cu.diff().tolist() == [n for n in lens if n]  # empty documents take no token
    assert max_len == max(lens, default=0)
    assert torch.equal(document_ids_from_lengths(cu.diff()).unique_consecutive(return_counts=True)[1],
                       torch.tensor([n for n in lens if n], dtype=torch.long))
    pos = packed_positions(ids)
    assert pos.tolist() == [j for n in lens for j in range(n)]


def test_document_ids_from_lengths_examples():
    assert document_ids_from_lengths([3, 2, 1]).tolist() == [0, 0, 0, 1, 1, 2]
    assert document_ids_from_lengths([2, 0, 1]).tolist() == [0, 0, 2]
    assert document_ids_from_lengths([]).shape == (0,)
    assert document_ids_from_lengths(torch.zeros(0, dtype=torch.long)).shape == (0,)
    # the offsets of the collator's packed row convert back to its seq_idx
    features = [{"input_ids": list(range(n))} for n in (4, 1, 3)]
    b = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(features)
    assert torch.equal(document_ids_from_lengths(b["cu_seq_lens_q"].diff()), b["seq_idx"][0].long())


# -- errors that name the likely mistake ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (torch.tensor([0, 5, 8, 15, 17], dtype=torch.int32), "looks like cu_seqlens"),
        (torch.tensor([0, 1]), "looks like cu_seqlens"),
        (torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 0]), "looks like position_ids"),
        (torch.tensor([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]]), "looks like position_ids"),
        (torch.tensor([4, 5, 6, 0, 1, 0, 1]), "looks like position_ids"),  # a chunk continues
        (torch.tensor([[2, 3, 4, 2, 3]]), "restart at 2"),  # RoBERTa-like positions from 2
        (torch.tensor([0, 0, 1, 1, 0]), ""),  # a document that comes back: no better guess
        (torch.tensor([0, 0, 0]), ""),
        (torch.tensor([3, 2, 1]), ""),
        (torch.tensor([[0, 3, 5]]), ""),  # cu_seqlens are 1-D
        (torch.tensor([0.0, 1.0]), ""),
        (torch.tensor([0]), ""),
        ([0, 5, 8], ""),
    ],
)
def test_document_ids_hint(value, text):
    hint = _document_ids_hint(value)
    if not text:
        assert hint == ""
    else:
        assert text in hint and hint[0].isupper() and hint.endswith(".")


def test_position_ids_as_document_ids_name_the_converter():
    pos = packed_positions(document_ids_from_lengths([3, 2, 4]))[None]  # [[0, 1, 2, 0, 1, 0, ...]]
    for call in (lambda: packed_positions(pos), lambda: cu_seqlens(pos),
                 lambda: cu_seqlens(pos, attention_mask=torch.ones_like(pos))):
        with pytest.raises(ValueError, match="one contiguous run") as info:
            call()
        assert "looks like position_ids" in str(info.value)
        assert "document_ids_from_positions(position_ids)" in str(info.value)
