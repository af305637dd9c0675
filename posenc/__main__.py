"""``python -m posenc``: the lab's command line (:mod:`posenc.lab.cli`)."""
from posenc.lab.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
