"""Masks a practitioner hands a model switched by ``posenc.hf.use`` that ran silently wrong or
failed obscurely (practitioner reading 2, items s33-s35, s96, o94, o97, o65): each is now
refused or warned with the fix, and the correct calls beside them still run.

Models are tiny transformers Llamas built from a config (test_hf_adapter's helpers).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import posenc
import posenc.hf

transformers = pytest.importorskip("transformers")
from test_hf_adapter import PAD, TOL, llama_config, logits  # noqa: E402
from transformers import DynamicCache, LlamaForCausalLM  # noqa: E402

DOCS = ([5, 17, 33, 8, 71], [9, 23, 50, 11])
PREFIX, TREE = [5, 17, 33, 8, 71, 9], [40, 41, 42, 43]
TREE_POS = torch.tensor([[6, 7, 7, 8]])


def _llama(scheme: object = "alibi") -> torch.nn.Module:
    torch.manual_seed(0)
    model = LlamaForCausalLM(copy.deepcopy(llama_config(initializer_range=0.2))).eval()
    return posenc.hf.use(model, scheme)


def _tree_mask() -> torch.Tensor:
    """``[1, 1, 4, 10]`` bool, True = sees: the prefix, then r, r-a, r-b, r-a-c."""
    vis = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    return torch.cat([torch.ones(4, len(PREFIX), dtype=torch.bool), vis], 1)[None, None]


def _cached(model: torch.nn.Module) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    logits(model, torch.tensor([PREFIX]), cache=cache, use_cache=True)
    return cache


# --------------------------------------------------------------------------- s35: document ids


@pytest.mark.parametrize("scheme", [None, "alibi"])
def test_s35_a_2d_mask_of_document_ids_is_refused_with_the_fixes(scheme):
    model = _llama(scheme)
    ids = torch.tensor([DOCS[0] + DOCS[1]])
    doc_ids = torch.tensor([[1] * 5 + [2] * 4])
    with pytest.raises(ValueError, match=r"attention_mask .* holds the values \{1, 2\}.*"
                       r"position_ids=posenc.packed_positions.*cu_seq_lens_q/k.*"
                       r"posenc.cu_seqlens\(document_ids\)"):
        logits(model, ids, attention_mask=doc_ids)
    additive = torch.zeros(1, 9).masked_fill(torch.arange(9) < 2, float("-inf"))
    with pytest.raises(ValueError, match=r"values \{-inf, 0\} \(torch.float32\)"):
        logits(model, ids, attention_mask=additive)
    # the fixes the message names give each document alone
    want = logits(model, torch.tensor([DOCS[1]]))[0]
    pos = posenc.packed_positions(doc_ids)
    torch.testing.assert_close(logits(model, ids, position_ids=pos)[0, 5:], want, **TOL)
    cu, _ = posenc.cu_seqlens(doc_ids)
    got = logits(model, ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    torch.testing.assert_close(got[0, 5:], want, **TOL)


@pytest.mark.parametrize("dtype", [torch.bool, torch.long, torch.int32, torch.float32])
def test_s35_0_1_masks_of_any_dtype_still_pad(dtype):
    model = _llama()
    ids = torch.tensor([[PAD, PAD] + DOCS[1]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]]).to(dtype)
    want = logits(model, torch.tensor([DOCS[1]]))[0]
    torch.testing.assert_close(logits(model, ids, attention_mask=mask)[0, 2:], want, **TOL)


def test_s35_generate_with_a_left_padded_batch_runs_unwarned():
    model = _llama(None)
    ids = torch.tensor([[PAD, PAD] + DOCS[1], DOCS[0] + [9]])
    mask = (ids != PAD).long()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                                 pad_token_id=PAD)
    assert out.shape == (2, 9)


# --------------------------------------------------------------------------- s33/s34: padding


def test_s33_restarting_position_ids_with_padding_warn_at_the_callers_line():
    model = _llama(None)
    d = [*DOCS, [40, 41, 42], [60, 61, 62, 63]]
    ids = torch.tensor([d[0] + d[1], d[2] + d[3] + [PAD, PAD]])
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3], [0, 1, 2, 0, 1, 2, 3, 0, 0]])
    mask = torch.tensor([[1] * 9, [1] * 7 + [0, 0]])
    with pytest.warns(UserWarning, match=r"position_ids restart inside row 0 .* attention_mask "
                      r"pads.*not split into documents.*no attention_mask \(or an all-ones one\)"
                      r".*cu_seq_lens_q/k") as record:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=pos)
    assert len(record) == 1 and record[0].filename == __file__
    # the fix: the collator's rows, no mask: the documents split
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = logits(model, ids[:1], position_ids=pos[:1])
    torch.testing.assert_close(got[0, 5:], logits(model, torch.tensor([d[1]]))[0], **TOL)
    # increasing positions under padding (generate's cumsum - 1, pads at 1) do not warn
    ok = torch.tensor([[1, 1, 0, 1, 2, 3, 4, 5, 6]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logits(model, ids[1:], attention_mask=torch.tensor([[0, 0] + [1] * 7]), position_ids=ok)


# --------------------------------------------------------------------------- s96: inverted tree


def test_s96_an_inverted_4d_bool_mask_is_refused():
    model = _llama()
    with pytest.raises(ValueError, match=r"lets no query see its own key.*True = masked.*"
                       r"True = the query may attend.*~mask"):
        logits(model, torch.tensor([TREE]), attention_mask=~_tree_mask(), position_ids=TREE_POS,
               cache=_cached(model))
    # the right convention runs: branch r-a-c equals the sequence alone
    got = logits(model, torch.tensor([TREE]), attention_mask=_tree_mask(), position_ids=TREE_POS,
                 cache=_cached(model))[0]
    want = logits(model, torch.tensor([PREFIX + [40, 41, 43]]))[0, 6:]
    torch.testing.assert_close(got[[0, 1, 3]], want, **TOL)


# --------------------------------------------------------------------------- o94/o97: 4-D forms


def test_o94_a_3d_mask_is_refused_with_the_unsqueeze():
    model = _llama()
    with pytest.raises(ValueError, match=r"2-D \[batch, keys\] padding mask .* or a 4-D "
                       r"\[batch, 1, queries, keys\].*got a 3-D torch.bool mask of shape "
                       r"\(1, 4, 10\): pass mask.unsqueeze\(1\)"):
        logits(model, torch.tensor([TREE]), attention_mask=_tree_mask()[:, 0],
               position_ids=TREE_POS, cache=_cached(model))


def test_o97_an_int_4d_mask_names_its_dtype_not_the_cache():
    model = _llama()
    one = torch.ones(1, 1, 1, len(PREFIX) + 1, dtype=torch.long)  # one query: [1, 1, 1, Lk]
    for mask in (_tree_mask().long(), one):
        pos = TREE_POS[:, : mask.shape[-2]]
        with pytest.raises(ValueError, match=r"4-D attention_mask must be bool .* got "
                           r"torch.int64 .*mask.bool\(\)"):
            logits(model, torch.tensor([TREE[: mask.shape[-2]]]), attention_mask=mask,
                   position_ids=pos, cache=_cached(model))
    got = logits(model, torch.tensor([TREE]), attention_mask=_tree_mask().long().bool(),
                 position_ids=TREE_POS, cache=_cached(model))
    assert torch.isfinite(got).all()


# --------------------------------------------------------------------------- o65: static reuse


def test_o65_a_full_static_cache_names_reset_too():
    layer = posenc.MultiHeadAttention(64, 4, scheme="alibi").eval()
    x = torch.randn(2, 8, 64)
    cache = posenc.KVCache(max_len=8)
    with torch.no_grad():
        layer(x, cache=cache)
        with pytest.raises(ValueError, match=r"holds 8 tokens and cannot take 1 more.*"
                           r"cache.reset\(\).*make max_len larger"):
            layer(x[:, :1], cache=cache)
        cache.reset()
        layer(x[:, :1], cache=cache)
    with pytest.raises(ValueError, match="make max_len larger") as info:  # nothing held: no reset
        layer(x[:, :4], cache=posenc.KVCache(max_len=3))
    assert "reset" not in str(info.value)


def test_a_tree_over_a_padded_prefix_counted_from_the_mask_is_refused():
    """A speculative tree over a left-padded cached prefix: its keys sit at their indices, so
    tree position_ids counted from the padding mask (cumsum) put a query before keys its mask
    lets it see, which causality would drop silently (1.5 off); the index count is right."""
    model = _llama("alibi")
    ids = torch.tensor([[PAD, PAD, 5, 17, 33, 8], [71, 9, 23, 50, 11, 12]])
    mask = (ids != PAD).long()
    P = ids.shape[1]
    vis = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    m4 = torch.cat([mask.bool()[:, None, :].expand(2, 4, P), vis.expand(2, 4, 4)], 2)[:, None]
    depth = torch.tensor([[0, 1, 1, 2]])
    tree = torch.tensor([[40, 41, 42, 43]] * 2)
    want = logits(model, torch.tensor([[5, 17, 33, 8, 40, 41, 43]]))[0, 4:]
    for pos, right in ((mask.sum(1, keepdim=True) + depth, False), (P + depth, True)):
        cache = DynamicCache(config=model.config)
        logits(model, ids, attention_mask=mask, cache=cache, use_cache=True)
        if not right:
            with pytest.raises(ValueError, match=r"count the tree's position_ids from the index"):
                logits(model, tree, attention_mask=m4, position_ids=pos, cache=cache)
            continue
        got = logits(model, tree, attention_mask=m4, position_ids=pos, cache=cache)
        torch.testing.assert_close(got[0, [0, 1, 3]], want, **TOL)


def test_a_tree_over_a_static_cache_with_spare_slots_is_named_not_called_inverted():
    """posenc places this step's tokens at the last Lq key slots; a StaticCache longer than the
    prefix plus the tree leaves them elsewhere: refused as such, not as an inverted mask."""
    from transformers import StaticCache

    model = _llama("alibi")
    prefix = torch.tensor([[5, 17, 33, 8]])
    cache = StaticCache(config=model.config, max_cache_len=16)
    logits(model, prefix, cache=cache, use_cache=True)
    vis = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    m4 = torch.zeros(1, 1, 4, 16, dtype=torch.bool)
    m4[..., :4], m4[..., 4:8] = True, vis
    with pytest.raises(ValueError, match=r"StaticCache with slots past them"):
        logits(model, torch.tensor([[40, 41, 42, 43]]), attention_mask=m4, cache=cache,
               position_ids=torch.tensor([[4, 5, 5, 6]]), cache_position=torch.arange(4, 8))
