import pytest
import torch

from nwlib import resolve_device


def test_auto_prefers_cuda_then_mps_then_cpu():
    expected = (
        "cuda"
        if torch.cuda.is_available()
        else ("mps" if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else "cpu")
    )
    assert resolve_device("auto").type == expected


def test_explicit_devices():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: cuda is a valid request here")
def test_unavailable_cuda_rejected():
    with pytest.raises(ValueError, match="CUDA"):
        resolve_device("cuda")


@pytest.mark.parametrize("bad,exc", [("gpu0", ValueError), (3, TypeError), (None, TypeError)])
def test_bad_device(bad, exc):
    with pytest.raises(exc, match="device"):
        resolve_device(bad)
