"""Data for the experiments: a byte-level corpus and synthetic tasks, with no download.

**Corpus.** :func:`load_corpus` reads Python standard-library sources: a fixed, sorted list of
modules (``STDLIB_MODULES``). By default they come from a snapshot shipped with the package
(``posenc/lab/corpus/stdlib-3.11.tar.xz``: CPython 3.11.7's ``Lib/`` files, PSF licence, SHA-256
checked on load), so every Python >= 3.10 trains on the same bytes; ``root=`` reads another
``Lib/`` directory instead (:func:`stdlib_root` is the running Python's). Each module is a file;
files are split into train and validation by a hash of the module name, so no file is on both
sides. The corpus reports its size and SHA-256: a run says exactly what it read.

**Synthetic tasks**, generated from a seed:

* :func:`make_passkey` / :func:`passkey_batch`: a random 5-digit key hidden at a random depth
  in repetitive filler text, asked for at the end (Mohtashami & Jaggi, 2023; used for the long
  context chapter).
* :func:`copy_batch`: a random string, a separator, and the same string again; the second copy
  can be predicted only by looking back exactly one string length.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import re
import sysconfig
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from .._checks import check_float, check_int

# Modules shipped as Python source by every CPython from 3.10 on (none of them is removed by
# PEP 594 or turned into a C stub). A module may be a file ``name.py`` or a package
# ``name/__init__.py`` (pathlib and zipfile became packages in 3.12-3.13): both are accepted.
STDLIB_MODULES: tuple[str, ...] = tuple(sorted((
    "argparse", "ast", "base64", "bdb", "bisect", "calendar", "cmd", "code", "codecs",
    "collections", "compileall", "concurrent.futures.process", "configparser", "contextlib",
    "copy", "csv", "dataclasses", "difflib", "dis", "doctest", "email._header_value_parser",
    "email.feedparser", "email.message", "enum", "fnmatch", "fractions", "ftplib", "functools",
    "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "html.parser", "http.client",
    "http.cookiejar", "http.server", "imaplib", "inspect", "ipaddress", "json.decoder",
    "json.encoder", "locale", "logging", "logging.config", "logging.handlers", "mailbox",
    "mimetypes", "multiprocessing.pool", "netrc", "ntpath", "operator", "optparse", "os",
    "pathlib", "pdb", "pickle", "pickletools", "platform", "plistlib", "poplib", "posixpath",
    "pprint", "profile", "pstats", "pydoc", "queue", "quopri", "random", "sched", "selectors",
    "shlex", "shutil", "smtplib", "socket", "socketserver", "ssl", "statistics", "string",
    "subprocess", "symtable", "tarfile", "tempfile", "textwrap", "threading", "timeit",
    "tokenize", "trace", "traceback", "turtle", "typing", "unittest.case", "unittest.mock",
    "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom",
    "xml.etree.ElementTree", "xmlrpc.client", "zipfile",
)))

SNAPSHOT = Path(__file__).with_name("corpus") / "stdlib-3.11.tar.xz"
"""The shipped corpus, ``Lib/<module path>.py`` of every ``STDLIB_MODULES`` entry, CPython 3.11.7."""
SNAPSHOT_SHA256 = "a561f513b1c13630935292d10df0fab148fbd62e0231aa8cd7c0003c1e084b0e"
SNAPSHOT_PYTHON = "3.11.7"

VAL_BUCKETS = 10  # a module is in validation when sha256(name) % VAL_BUCKETS == 0
SEPARATOR = b"\n\n"  # between files in a split's byte stream


def is_validation(module: str) -> bool:
    """Whether ``module`` belongs to the validation split: ``sha256(name) % 10 == 0``."""
    return int(hashlib.sha256(module.encode()).hexdigest(), 16) % VAL_BUCKETS == 0


def stdlib_root() -> Path:
    """The running Python's standard-library directory (its ``Lib/``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _module_paths(module: str) -> tuple[str, str]:
    rel = Path(*module.split("."))
    return rel.with_suffix(".py").as_posix(), (rel / "__init__.py").as_posix()


def write_snapshot(path, root=None, modules: tuple[str, ...] = STDLIB_MODULES) -> str:
    """Write the corpus snapshot (a reproducible ``.tar.xz``: ``Lib/...`` members, sorted, zero
    times and owners) of ``modules`` read under ``root`` (default :func:`stdlib_root`) to
    ``path``; returns its SHA-256. This is how ``SNAPSHOT`` was made (on CPython 3.11.7)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for module in sorted(modules):
            src = stdlib_path(module, root)
            data = src.read_bytes()
            name = _module_paths(module)[src.name == "__init__.py"]
            info = tarfile.TarInfo("Lib/" + name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    blob = lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME)
    Path(path).write_bytes(blob)
    return hashlib.sha256(blob).hexdigest()


def _read_snapshot() -> dict[str, bytes]:
    """``{member name: bytes}`` of the shipped snapshot, after checking its SHA-256."""
    blob = SNAPSHOT.read_bytes()
    sha = hashlib.sha256(blob).hexdigest()
    if sha != SNAPSHOT_SHA256:
        raise ValueError(
            f"corpus snapshot {SNAPSHOT} has SHA-256 {sha}, expected {SNAPSHOT_SHA256}: the file is "
            "damaged or was replaced; reinstall posenc"
        )
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(blob)), mode="r:") as tar:
        return {
            m.name: f.read()
            for m in tar.getmembers()
            if m.isfile() and (f := tar.extractfile(m)) is not None  # never None for a file
        }


def stdlib_path(module: str, root=None):
    """The source file (a ``pathlib.Path``) of a standard-library ``module`` (``a.b`` ->
    ``a/b.py`` or ``a/b/__init__.py``), under ``root`` (a path or string; default: this
    Python's ``stdlib`` directory)."""
    root = stdlib_root() if root is None else Path(root)
    rel = Path(*module.split("."))
    for path in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"no source for standard-library module {module!r} under {root} (looked for "
        f"{rel.with_suffix('.py')} and {rel / '__init__.py'}); posenc's corpus needs a Python "
        "installed with its .py sources"
    )


@dataclass(frozen=True)
class Corpus:
    """A byte corpus split by file.

    ``train`` and ``val`` are ``uint8`` tensors (the files of each split joined by a blank
    line); ``sha256`` hashes every file's name and bytes in order; ``bytes`` is the total size
    of the files; ``files`` lists ``(module, split, size)``.
    """

    train: Tensor
    val: Tensor
    sha256: str
    bytes: int
    files: tuple[tuple[str, str, int], ...] = field(repr=False)
    python: str = ""

    def __post_init__(self) -> None:
        for name in ("train", "val"):
            t = getattr(self, name)
            if not isinstance(t, Tensor) or t.dim() != 1 or t.dtype != torch.uint8:
                raise TypeError(f"{name} must be a 1-D uint8 tensor, got {t!r:.60}")
        if not isinstance(self.sha256, str) or len(self.sha256) != 64:
            raise ValueError(f"sha256 must be a 64-character hex string, got {self.sha256!r}")

    def __repr__(self) -> str:
        n_val = sum(1 for _, s, _ in self.files if s == "val")
        return (
            f"Corpus({self.bytes:,} bytes from {len(self.files)} files of Python {self.python}: "
            f"train {self.train.numel():,} bytes, val {self.val.numel():,} bytes from {n_val} files; "
            f"sha256 {self.sha256[:16]}...)"
        )

    def summary(self) -> dict:
        """``{"bytes", "sha256", "files", "train_bytes", "val_bytes", "python"}`` for reports."""
        return {
            "bytes": self.bytes, "sha256": self.sha256, "files": len(self.files),
            "train_bytes": int(self.train.numel()), "val_bytes": int(self.val.numel()),
            "python": self.python,
        }  # fmt: skip


_CORPUS_CACHE: dict[tuple, Corpus] = {}


def load_corpus(
    modules: tuple[str, ...] | list[str] | None = None, *, root=None
) -> Corpus:
    """Read the standard-library corpus (``STDLIB_MODULES`` by default); cached per process.

    ``root=None`` reads the shipped snapshot (CPython 3.11.7, the same bytes on every Python);
    ``root`` (a path or string, e.g. :func:`stdlib_root`) reads the ``.py`` files under that
    directory instead.
    """
    import platform

    if isinstance(modules, str):
        raise TypeError(f"modules must be a list of module names, got the string {modules!r}")
    modules = tuple(sorted(STDLIB_MODULES if modules is None else modules))
    if not modules:
        raise ValueError("modules must name at least one standard-library module, got []")
    for m in modules:
        if not isinstance(m, str):
            raise TypeError(f"modules must hold module names (str), got {m!r}")
    if root is not None and not isinstance(root, (str, Path)):
        raise TypeError(f"root must be None, a str or a path, got {type(root).__name__}")
    key = (modules, None if root is None else str(root))
    if key in _CORPUS_CACHE:
        return _CORPUS_CACHE[key]
    if root is None:
        members = _read_snapshot()

        def read(module: str) -> bytes:
            for name in _module_paths(module):
                if "Lib/" + name in members:
                    return members["Lib/" + name]
            raise ValueError(f"modules: {module!r} is not in the corpus snapshot; allowed: STDLIB_MODULES")
    else:

        def read(module: str) -> bytes:
            return stdlib_path(module, root).read_bytes()

    digest = hashlib.sha256()
    parts: dict[str, list[bytes]] = {"train": [], "val": []}
    files = []
    for module in modules:
        data = read(module)
        split = "val" if is_validation(module) else "train"
        parts[split].append(data)
        files.append((module, split, len(data)))
        digest.update(module.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    if not parts["train"] or not parts["val"]:
        raise ValueError(f"modules {modules} give an empty train or validation split")

    def stream(chunks: list[bytes]) -> Tensor:
        return torch.frombuffer(bytearray(SEPARATOR.join(chunks)), dtype=torch.uint8).clone()

    corpus = Corpus(
        train=stream(parts["train"]), val=stream(parts["val"]), sha256=digest.hexdigest(),
        bytes=sum(size for _, _, size in files), files=tuple(files),
        python=SNAPSHOT_PYTHON if root is None else platform.python_version(),
    )
    _CORPUS_CACHE[key] = corpus
    return corpus


def random_windows(
    data: Tensor, batch_size: int, length: int, *, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """``batch_size`` random windows of ``data``: inputs and next-byte targets, each ``[B, L]``
    (``int64``, on ``data``'s device)."""
    batch_size = check_int("batch_size", batch_size, minimum=1)
    length = check_int("length", length, minimum=1)
    if data.dim() != 1 or data.numel() < length + 1:
        raise ValueError(f"data must be 1-D with more than length={length} items, got {tuple(data.shape)}")
    starts = torch.randint(0, data.numel() - length, (batch_size,), generator=generator)  # [B]
    idx = starts[:, None] + torch.arange(length + 1)  # [B, L+1]
    chunk = data[idx.to(data.device)].long()
    return chunk[:, :-1], chunk[:, 1:]


def eval_chunks(
    data: Tensor, length: int, num_tokens: int, *, block: int | None = None
) -> tuple[Tensor, Tensor]:
    """Evaluation windows: inputs and next-byte targets ``[N, length]``.

    The text is ``num_tokens // block`` segments of ``block`` bytes (default ``length``) spread
    evenly over ``data``, so the windows sample every file of the split rather than the first
    one. Each segment is cut into ``block // length`` non-overlapping windows. With the same
    ``block`` (the longest length evaluated) every length sees the same text, so losses at
    different lengths compare like with like.
    """
    length = check_int("length", length, minimum=1)
    num_tokens = check_int("num_tokens", num_tokens, minimum=1)
    block = length if block is None else check_int("block", block, minimum=length)
    n = max(1, num_tokens // block)
    if data.dim() != 1 or data.numel() < block + 1:
        raise ValueError(
            f"data has {data.numel()} items, too few for a window of length {block} (+1)"
        )
    starts = torch.linspace(0, data.numel() - block - 1, n, dtype=torch.float64).long()  # [n]
    seg = data[(starts[:, None] + torch.arange(block + 1)).to(data.device)].long()  # [n, block+1]
    usable = (block // length) * length
    return seg[:, :usable].reshape(-1, length), seg[:, 1 : usable + 1].reshape(-1, length)


# --------------------------------------------------------------------- synthetic tasks

FILLER = b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = b" What is the pass key? The pass key is "


@dataclass(frozen=True)
class PasskeyExample:
    """``tokens [length]`` (int64 bytes) end with the question and the 5-digit ``key``, which
    occupies ``tokens[answer_start:answer_start + 5]``; the key was stated at ``key_start``."""

    tokens: Tensor
    key: str
    key_start: int
    answer_start: int
    depth: float


def _needle(key: str) -> bytes:
    return f"The pass key is {key}. Remember it. {key} is the pass key. ".encode()


def passkey_min_length() -> int:
    """The shortest sequence that holds the needle, the question and the answer."""
    return len(_needle("00000")) + len(QUESTION) + 5


def make_passkey(
    length: int, *, seed: int | None = None, depth: float | None = None,
    generator: torch.Generator | None = None,
) -> PasskeyExample:
    """One passkey-retrieval example of exactly ``length`` bytes.

    The key is 5 random digits (first digit non-zero); the needle sentence sits at fraction
    ``depth`` of the filler (random in ``[0, 1]`` if ``None``); the sequence ends with the
    question and the key itself, so the model's task is to predict the last 5 bytes.
    """
    length = check_int("length", length, minimum=passkey_min_length())
    if depth is not None:
        depth = check_float("depth", depth, minimum=0.0)
        if depth > 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
    if generator is None:
        generator = torch.Generator().manual_seed(0 if seed is None else check_int("seed", seed, minimum=0))
    key = str(int(torch.randint(10000, 100000, (1,), generator=generator)))
    if depth is None:
        depth = float(torch.rand((), generator=generator))
    needle, tail = _needle(key), QUESTION + key.encode()
    n_filler = length - len(needle) - len(tail)
    filler = (FILLER * (n_filler // len(FILLER) + 1))[:n_filler]
    # snap the needle to the nearest sentence boundary of the filler, so the text stays readable
    bounds = [0] + [m.end() for m in re.finditer(rb"\. ", filler)] + [n_filler]
    cut = min(bounds, key=lambda b: abs(b - depth * n_filler))
    text = filler[:cut] + needle + filler[cut:] + tail
    assert len(text) == length
    tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    return PasskeyExample(
        tokens=tokens, key=key, key_start=cut + needle.index(key.encode()),
        answer_start=length - 5, depth=depth,
    )


def passkey_batch(
    batch_size: int, length: int, *, seed: int = 0, depth: float | None = None
) -> tuple[Tensor, Tensor, list[str]]:
    """``batch_size`` passkey examples: ``tokens [B, L]``, ``answer_mask [B, L]`` (True at the
    positions whose *next* byte is a key digit, i.e. where the model must predict it) and the
    keys."""
    batch_size = check_int("batch_size", batch_size, minimum=1)
    gen = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
    examples = [make_passkey(length, depth=depth, generator=gen) for _ in range(batch_size)]
    tokens = torch.stack([e.tokens for e in examples])  # [B, L]
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, length - 6 : length - 1] = True  # predicting tokens[L-5 : L]
    return tokens, mask, [e.key for e in examples]


def copy_batch(
    batch_size: int, length: int, *, seed: int = 0, alphabet: bytes = b"abcdefghijklmnopqrstuvwxyz",
    separator: int = ord("|"),
) -> tuple[Tensor, Tensor, Tensor]:
    """The copying task: ``s | s`` with ``s`` random letters, ``len(s) = (length - 1) // 2``.

    Returns inputs and next-byte targets ``[B, L]`` and a mask ``[B, L]`` that is True where
    the target lies in the second copy (the only predictable part). ``length`` is the input
    length; the full sequence has ``length + 1`` bytes.
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    length = check_int("length", length, minimum=3)
    if not alphabet or separator in alphabet:
        raise ValueError("alphabet must be non-empty and must not contain the separator")
    gen = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
    n = length // 2  # sequence of length + 1 = 2n + 1 (+1 when length is odd)
    letters = torch.tensor(list(alphabet), dtype=torch.long)
    s = letters[torch.randint(0, len(alphabet), (batch_size, n), generator=gen)]  # [B, n]
    sep = torch.full((batch_size, 1), separator, dtype=torch.long)
    seq = torch.cat([s, sep, s], dim=1)  # [B, 2n + 1]
    if seq.shape[1] < length + 1:
        seq = torch.cat([sep, seq], dim=1)  # odd length: one more separator in front
    x, y = seq[:, :-1], seq[:, 1:]  # [B, L]
    mask = torch.zeros_like(y, dtype=torch.bool)
    mask[:, -n:] = True
    return x, y, mask
