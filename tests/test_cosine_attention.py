"""nwlib.cosine_attention against explicit formulas: softmax of cosine similarities, and a Gaussian kernel."""

import math

import pytest
import torch

from nwlib import cosine_attention, nadaraya_watson

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tau", [0.05, 1.0, 7.0])
def test_matches_softmax_of_cosines(dtype, tau):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 3, generator=g, dtype=dtype) * 4
    k = torch.randn(2, 40, 3, generator=g, dtype=dtype) * torch.rand(2, 40, 1, generator=g, dtype=dtype)
    v = torch.randn(2, 40, 2, generator=g, dtype=dtype)
    cos = torch.einsum("bmd,bnd->bmn", q, k) / (q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :])
    ref = torch.softmax(cos / tau, dim=-1) @ v
    out = cosine_attention(q, k, v, temperature=tau)
    assert out.dtype == dtype and out.shape == (2, 5, 2)
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_is_a_gaussian_kernel_on_the_sphere():
    """Equal-norm keys: exp(<q,k>/tau) and the Gaussian kernel of bandwidth sqrt(tau) give the same weights."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(4, 3, generator=g, dtype=torch.float64),
        torch.randn(30, 3, generator=g, dtype=torch.float64),
        torch.randn(30, generator=g, dtype=torch.float64),
    )
    qn, kn = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    ref = nadaraya_watson(qn, kn, v, kernel="gaussian", bandwidth=math.sqrt(0.3))
    torch.testing.assert_close(cosine_attention(q, k, v, temperature=0.3), ref, atol=1e-12, rtol=1e-12)


def test_per_head_temperature_tensor():
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(3, 4, 5, generator=g), torch.randn(3, 20, 5, generator=g), torch.randn(3, 20, generator=g)
    taus = torch.tensor([0.1, 0.5, 2.0])
    out = cosine_attention(q, k, v, temperature=taus.view(3))
    for h in range(3):
        torch.testing.assert_close(
            out[h], cosine_attention(q[h], k[h], v[h], temperature=float(taus[h])), atol=1e-5, rtol=1e-5
        )


def test_bad_inputs_name_the_argument():
    q, k, v = torch.randn(2, 3), torch.randn(5, 3), torch.randn(5)
    with pytest.raises(ValueError, match="temperature"):
        cosine_attention(q, k, v, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        cosine_attention(q, k, v, temperature=float("nan"))
    k0 = k.clone()
    k0[1] = 0
    with pytest.raises(ValueError, match="keys"):
        cosine_attention(q, k0, v, temperature=1.0)
    with pytest.raises(TypeError):
        cosine_attention(q.double(), k, v, temperature=1.0)
