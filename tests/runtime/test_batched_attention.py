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
