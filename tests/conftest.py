import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("posenc", max_examples=40, deadline=None)
settings.load_profile("posenc")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # several workers share the cores: one thread each (also for the notebook kernels nbval starts,
    # which inherit this environment), so OpenMP threads never wait on a busy core
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
else:
    torch.set_num_threads(2)

# The chapters that train models take most of the run: with pytest-xdist they go to the workers
# first (in this order), and the short files fill the cores around them. Without this, xdist
# sends the files with the most tests first and the training chapters start last.
TRAINING_FIRST = ("book/06_side_by_side.ipynb", "book/07_long_context_rules.ipynb",
                  "book/08_long_context_practice.ipynb", "book/09_todays_models.ipynb")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep the collection order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return TRAINING_FIRST.index(path) if path in TRAINING_FIRST else len(TRAINING_FIRST)

    items.sort(key=rank)  # stable: the order within each file and among the rest is kept
