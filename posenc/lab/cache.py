"""The lab's on-disk cache: trained weights and evaluations, written atomically, one writer at a time.

Directory: :func:`set_cache_dir`, else ``$POSENC_CACHE``, else ``platformdirs.user_cache_dir("posenc")``
when platformdirs is installed, else ``$XDG_CACHE_HOME/posenc``, else ``~/.cache/posenc``. Files are
written to a temporary name and renamed (:func:`atomic_save`), read with
``torch.load(weights_only=True)``, and :func:`locked` holds a ``filelock.FileLock`` (filelock ships
with torch) so two processes never train the same model at once.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

FORMAT_VERSION = 1  # bump when a change to posenc makes cached weights stale
FINE_TUNE_FORMAT_VERSION = 1  # bump when a change makes cached fine-tuned weights stale

_cache_dir: Path | None = None


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Use ``path`` (a string or path) for the cache from now on (``None``: back to the default)."""
    global _cache_dir
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str, a path or None, got {type(path).__name__}")
    _cache_dir = None if path is None else Path(path).expanduser()


def default_cache_dir() -> Path:
    """``$POSENC_CACHE``, else the platform's user cache directory for ``posenc``."""
    env = os.environ.get("POSENC_CACHE")
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:
        xdg = os.environ.get("XDG_CACHE_HOME")
        return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "posenc"
    return Path(platformdirs.user_cache_dir("posenc"))


def cache_dir() -> Path:
    """Where trained weights and evaluations live: :func:`set_cache_dir`, else
    :func:`default_cache_dir`."""
    return _cache_dir if _cache_dir is not None else default_cache_dir()


def atomic_save(obj: object, path: Path) -> None:
    """``torch.save`` to a temporary file next to ``path``, then rename it (never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def locked(path: Path, *, enabled: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (the file ``path.lock``) for the block, across
    processes; a second process waits until the first has written its result."""
    if not enabled:
        yield
        return
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        yield
