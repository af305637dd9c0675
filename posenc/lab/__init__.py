"""posenc.lab: the book's laboratory (figures, tiny models, data, training, experiments).

Not needed to use positional encodings: ``import posenc`` never imports this package.
"""

from . import plot

__all__ = ["plot"]
