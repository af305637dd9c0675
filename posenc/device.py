"""Pick the best available device, so chapters stay one-liners."""

from __future__ import annotations

import torch

from ._checks import check_device


def default_device(device: str | torch.device | None = None) -> torch.device:
    """``cuda`` if available, else ``mps`` (Apple silicon), else ``cpu``.

    Given a ``device`` (``"cpu"``, ``"cuda:1"``, a ``torch.device``), return it as a
    ``torch.device`` after checking that it exists on this machine, so a typo or a missing GPU
    fails here with a clear message rather than at the first tensor moved there.
    """
    if device is not None:
        return check_device("device", device, available=True)  # type: ignore[return-value]
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
