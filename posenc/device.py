"""Pick the best available device, so chapters stay one-liners."""

from __future__ import annotations

import torch


def default_device() -> torch.device:
    """``cuda`` if available, else ``mps`` (Apple silicon), else ``cpu``."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
