import torch
from hypothesis import settings

settings.register_profile("posenc", max_examples=40, deadline=None)
settings.load_profile("posenc")
torch.set_num_threads(2)
