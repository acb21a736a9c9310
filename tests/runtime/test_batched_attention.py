"""The batched decode attention (`attention.attend_rows`: one call for the decode tokens of several
sessions over a padded view) equals each session attended alone (`attention.sdpa`, the solo
forward's kernel), in float32 and bfloat16 (whose call layouts differ), with and without GQA."""

from __future__ import annotations

import pytest
import torch

from kvagent.runtime.attention import attend_rows, sdpa


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("h_q", "h_kv"), [(6, 2), (4, 4)])
@pytest.mark.parametrize("lengths", [[9, 13, 11], [12, 12, 12]])
def test_rows_equal_each_row_attended_alone(dtype, h_q, h_kv, lengths):
    gen = torch.Generator().manual_seed(0)
    b, d, cap = len(lengths), 16, 16
    keys = torch.randn(b, h_kv, cap, d, generator=gen).to(dtype)
    values = torch.randn(b, h_kv, cap, d, generator=gen).to(dtype)
    # The padding past each row's length is garbage: the mask must hide it.
    for i, n in enumerate(lengths):
        keys[i, :, n:], values[i, :, n:] = 1e3, -1e3
    query = torch.randn(b, h_q, d, generator=gen).to(dtype)
    out = attend_rows(query, keys, values, lengths, 0.25, "sdpa")
    assert out.shape == (1, b, h_q, d)
    for i, n in enumerate(lengths):
        alone = sdpa(query[i][None, :, None], keys[i : i + 1, :, :n], values[i : i + 1, :, :n], 0.25)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out[0, i].float(), alone[0, 0].float(), atol=tol, rtol=tol)


def test_decode_calls_are_kept_to_the_kernels_decode_backends_names(monkeypatch):
    # On CUDA, decode_backends leaves out cuDNN (a graph build per new key length). Here the same
    # route is driven on the CPU with a list no CPU kernel satisfies: decode calls (one query, and
    # attend_rows' runs) must fail on it, and chunk calls must not see it.
    from torch.nn.attention import SDPBackend

    from kvagent.runtime import attention

    assert attention.decode_backends("cpu") is None
    on_cuda = attention.decode_backends("cuda")
    assert SDPBackend.CUDNN_ATTENTION not in on_cuda and SDPBackend.FLASH_ATTENTION in on_cuda
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 2, 9, 8, generator=g)
    one, chunk = torch.randn(1, 4, 1, 8, generator=g), torch.randn(1, 4, 3, 8, generator=g)
    before = sdpa(one, k, k, 0.3)
    monkeypatch.setattr(attention, "decode_backends", lambda device_type: [SDPBackend.CUDNN_ATTENTION])
    with pytest.raises(RuntimeError):
        sdpa(one, k, k, 0.3)
    with pytest.raises(RuntimeError):
        attend_rows(one[:, :, 0], k, k, [9], 0.3, "sdpa")
    sdpa(chunk, k, k, 0.3)  # a chunk keeps PyTorch's own choice
    monkeypatch.setattr(attention, "decode_backends", lambda device_type: [SDPBackend.MATH])
    assert torch.allclose(sdpa(one, k, k, 0.3), before, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("h_q", "h_kv"), [(6, 2), (4, 4)])
def test_a_chunk_on_a_cache_gets_the_lower_right_causal_bias_not_a_bool_mask(monkeypatch, dtype, h_q, h_kv):
    # A bool mask sent bf16 GQA chunks to cuDNN on the H200 (a graph per new key length); the
    # causal bias goes to flash. The bias must mask exactly what the bool mask did: each chunk
    # query sees every cached entry and the chunk up to itself.
    import torch.nn.functional as F
    from torch.nn.attention.bias import CausalBias

    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, h_q, 5, 16, generator=g).to(dtype)
    k, v = (torch.randn(1, h_kv, 12, 16, generator=g).to(dtype) for _ in range(2))
    bool_mask = torch.ones(5, 12, dtype=torch.bool).tril(12 - 5)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask, scale=0.3, enable_gqa=h_q != h_kv)
    from kvagent.runtime import attention

    seen = []
    real = attention.sdpa_call
    monkeypatch.setattr(
        attention, "sdpa_call", lambda *a, **kw: seen.append(kw["attn_mask"]) or real(*a, **kw)
    )
    got = sdpa(q, k, v, 0.3)
    assert len(seen) == 1 and isinstance(seen[0], CausalBias)
    torch.testing.assert_close(got, want.transpose(1, 2))
    # PAD entries (a ragged layer) still need a per-head bool mask, causal within the chunk
    valid = torch.ones(1, h_kv, 12, dtype=torch.bool)
    valid[:, 0, 2] = False
    seen.clear()
    ragged = sdpa(q, k, v, 0.3, valid)
    assert seen[0].dtype == torch.bool and not seen[0][0, 0, :, 2].any() and not seen[0][0, -1, 0, 8:].any()
    assert not torch.equal(ragged, got)


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_folds_query_groups_in_bf16_where_the_cpu_has_no_bf16_units(monkeypatch, dtype, ragged):
    # SDPA's GQA kernel for one bf16 query was 5-7x slower than the folded layout on an AVX2-only
    # CPU; the folded call must attend exactly as the GQA one, PAD entries (ragged heads) included,
    # and float32 must keep its GQA call (the study's numerics do not move).
    from kvagent.runtime import attention

    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 6, 1, 16, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, 11, 16, generator=g).to(dtype) for _ in range(2))
    valid = None
    if ragged:
        valid = torch.ones(1, 2, 11, dtype=torch.bool)
        valid[0, 1, :3] = False
    calls = []
    real = attention.sdpa_call
    monkeypatch.setattr(
        attention, "sdpa_call", lambda *a, **kw: calls.append((a[0].shape, kw)) or real(*a, **kw)
    )
    monkeypatch.setattr(attention, "CPU_BF16_UNITS", True)
    with_gqa = sdpa(q, k, v, 0.3, valid)
    assert calls[-1][1]["enable_gqa"] is True
    monkeypatch.setattr(attention, "CPU_BF16_UNITS", False)
    got = sdpa(q, k, v, 0.3, valid)
    folded = dtype != torch.float32
    assert calls[-1][0] == ((1, 2, 3, 16) if folded else (1, 6, 1, 16))
    assert calls[-1][1].get("enable_gqa", False) is not folded
    assert got.shape == (1, 1, 6, 16)
    torch.testing.assert_close(got.float(), with_gqa.float(), atol=1e-6, rtol=0)
    if ragged:  # the masked entries really are hidden: unmasked, head group 1 reads them
        assert not torch.allclose(got.float(), sdpa(q, k, v, 0.3).float(), atol=1e-3)


def test_on_cuda_only_a_masked_call_folds_its_query_groups():
    # CUDA has no fused kernel for a masked GQA call once cuDNN is left out (flash: no mask;
    # memory-efficient: no GQA), and the math kernel copies K/V out to every query head: the
    # H200's batched step ran out of memory at N=32. A stand-in tensor carries the device type.
    from types import SimpleNamespace

    from kvagent.runtime.attention import fold_query_groups

    for dtype in (torch.float32, torch.bfloat16):
        on_cuda = SimpleNamespace(device=torch.device("cuda"), dtype=dtype)
        for decode in (True, False):
            assert fold_query_groups(on_cuda, masked=True, decode=decode) is True
            assert fold_query_groups(on_cuda, masked=False, decode=decode) is False
    assert fold_query_groups(torch.zeros(1, dtype=torch.float32), masked=True) is False
    # A CPU chunk keeps GQA whatever the dtype: the fold was measured for one decode query only.
    assert fold_query_groups(torch.zeros(1, dtype=torch.bfloat16), masked=True, decode=False) is False


@pytest.mark.parametrize("q_len", [1, 5])
def test_a_folded_call_equals_the_gqa_call_with_pads_and_causal_mask(monkeypatch, q_len):
    # A ragged layer (PAD entries after Session.forget) under a chunk: folded, each KV head's
    # group of query heads must see that head's PADs hidden and its own causal rows.
    from kvagent.runtime import attention

    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 6, q_len, 16, generator=g)
    k, v = (torch.randn(1, 2, 11, 16, generator=g) for _ in range(2))
    valid = torch.ones(1, 2, 11, dtype=torch.bool)
    valid[0, 1, :3] = False
    gqa = sdpa(q, k, v, 0.3, valid)
    calls = []
    real = attention.sdpa_call
    monkeypatch.setattr(
        attention, "sdpa_call", lambda *a, **kw: calls.append((a[0].shape, kw)) or real(*a, **kw)
    )
    monkeypatch.setattr(attention, "fold_query_groups", lambda q, masked=False, decode=True: masked)
    folded = sdpa(q, k, v, 0.3, valid)
    assert calls[-1][0] == (1, 2, 3 * q_len, 16) and not calls[-1][1].get("enable_gqa", False)
    torch.testing.assert_close(folded, gqa, atol=1e-6, rtol=0)
    assert not torch.allclose(folded, sdpa(q, k, v, 0.3), atol=1e-3)  # the PADs really are hidden


@pytest.mark.parametrize("lengths", [[9, 13, 11], [12, 12, 12]])
def test_decode_callers_tell_the_fold_rule_whether_their_call_is_masked(monkeypatch, lengths):
    from kvagent.runtime import attention

    seen = []
    real = attention.fold_query_groups
    monkeypatch.setattr(
        attention,
        "fold_query_groups",
        lambda q, masked=False, decode=True: seen.append(masked) or real(q, masked, decode),
    )
    g = torch.Generator().manual_seed(4)
    b = len(lengths)
    keys, values = (torch.randn(b, 2, 16, 8, generator=g).to(torch.bfloat16) for _ in range(2))
    attend_rows(torch.randn(b, 6, 8, generator=g).to(torch.bfloat16), keys, values, lengths, 0.3, "sdpa")
    assert seen == [min(lengths) != max(lengths)]
    one = torch.randn(1, 6, 1, 8, generator=g).to(torch.bfloat16)
    valid = torch.ones(1, 2, 16, dtype=torch.bool)
    sdpa(one, keys[:1], values[:1], 0.3)
    sdpa(one, keys[:1], values[:1], 0.3, valid)
    assert seen[1:] == [False, True]
