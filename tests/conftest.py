import os

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
