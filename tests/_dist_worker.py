"""One rank of the 2-process tests in ``tests/test_distributed.py`` (gloo, CPU, no network).

    python tests/_dist_worker.py SCENARIOS RANK WORLD_SIZE PORT OUT_DIR

``SCENARIOS`` is a comma-separated list (one process group serves them all: starting Python and
torch is most of the cost). Every rank builds the same seeded inputs, does its part of the work
and saves what it computed to ``OUT_DIR/<scenario>_rank<RANK>.pt``; the test recomputes
everything in one process and compares. Nothing is compared here, so a wrong result can never
pass silently on a rank.

Scenarios:

- ``fsdp``: FSDP2 (``fully_shard``) over ``posenc.lab.model.TransformerLM``; each rank trains
  on its half of the batch; saves the loss, the full gradients (``DTensor.full_tensor``), each
  rank's local gradient shard and the full parameters after one AdamW step.
- ``cp``: the positions part of context parallelism: each rank holds the head-tail shard
  (``posenc.shard_positions``) of a sequence, projects its local q, k, v, all-gathers the
  (unrotated) k, v and the key positions and calls ``posenc.attend`` with
  ``positions=`` / ``key_positions=``; saves its output rows. Also records what torch's own
  ``context_parallel`` does with CPU SDPA.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from datetime import timedelta

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

# the shared inputs: every rank and the test's single-process reference build them alike
FSDP_MODELS = {  # name -> (TransformerLM keyword arguments, shard each block or only the root)
    "rope": ({"scheme": "rope", "dim": 32, "num_layers": 2, "num_heads": 4, "vocab_size": 64}, True),
    # T5's table is one parameter shared by every block (model.scheme): only the root shards it
    "t5": ({"scheme": "t5", "dim": 32, "num_layers": 2, "num_heads": 4, "vocab_size": 64}, False),
}
FSDP_BATCH, FSDP_LEN, FSDP_LR = 4, 16, 1e-2

CP_SCHEMES = ("rope", "alibi", "t5")
CP_DIM, CP_HEADS, CP_LEN, CP_BATCH = 32, 4, 16, 2
CP_KV_HEADS = (4, 2, 1)  # MHA, GQA, MQA


def fsdp_model(name: str) -> torch.nn.Module:
    from posenc.lab.model import TransformerLM

    torch.manual_seed(0)
    return TransformerLM(**FSDP_MODELS[name][0])


def fsdp_batch(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens, targets [FSDP_BATCH, FSDP_LEN]``; rank ``r`` of ``W`` trains on the rows
    ``[r * B / W, (r + 1) * B / W)``."""
    vocab = FSDP_MODELS[name][0]["vocab_size"]
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (FSDP_BATCH, FSDP_LEN), generator=g)
    targets = torch.randint(0, vocab, (FSDP_BATCH, FSDP_LEN), generator=g)
    return tokens, targets


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=FSDP_LR, betas=(0.9, 0.95), weight_decay=0.1)


class CPLayer(torch.nn.Module):
    """q, k, v projections of ``x [B, L, dim]`` into ``[B, H, L, Dh]`` / ``[B, H_kv, L, Dh]``."""

    def __init__(self, kv_heads: int) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.h, self.h_kv, self.dh = CP_HEADS, kv_heads, CP_DIM // CP_HEADS
        self.q = torch.nn.Linear(CP_DIM, CP_HEADS * self.dh, bias=False)
        self.k = torch.nn.Linear(CP_DIM, kv_heads * self.dh, bias=False)
        self.v = torch.nn.Linear(CP_DIM, kv_heads * self.dh, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.h, self.dh).transpose(1, 2)
        k = self.k(x).view(B, L, self.h_kv, self.dh).transpose(1, 2)
        v = self.v(x).view(B, L, self.h_kv, self.dh).transpose(1, 2)
        return q, k, v


def cp_scheme(name: str):
    from posenc import make_scheme

    scheme = make_scheme(name, dim=CP_DIM, num_heads=CP_HEADS, causal=True)
    if name == "t5":  # a seeded random table, so every bucket differs
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            scheme.rel.embedding.weight.copy_(torch.randn(scheme.rel.embedding.weight.shape, generator=g))
    return scheme


def cp_input() -> torch.Tensor:
    g = torch.Generator().manual_seed(4)
    return torch.randn(CP_BATCH, CP_LEN, CP_DIM, generator=g)


def _gather(t: torch.Tensor, world: int, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=dim)


def run_fsdp(rank: int, world: int) -> dict:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    out: dict = {}
    for name, (_, per_block) in FSDP_MODELS.items():
        model = fsdp_model(name)
        if per_block:
            for block in model.blocks:
                fully_shard(block)
        fully_shard(model)
        opt = make_optimizer(model)
        tokens, targets = fsdp_batch(name)
        n = FSDP_BATCH // world
        rows = slice(rank * n, (rank + 1) * n)
        loss = model.loss(tokens[rows], targets[rows])  # mean over this rank's rows
        loss.backward()  # FSDP2 reduce-scatters the gradients with the mean over the ranks
        full, local, kinds = {}, {}, {}
        for pname, p in model.named_parameters():
            g = p.grad
            kinds[pname] = type(g).__name__
            if isinstance(g, DTensor):
                full[pname] = g.full_tensor().detach().clone()
                local[pname] = g.to_local().detach().clone()
            else:
                full[pname] = g.detach().clone()
        opt.step()
        after = {
            pname: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for pname, p in model.named_parameters()
        }
        out[name] = {"loss": loss.detach(), "grads": full, "local": local, "kinds": kinds,
                     "after": after}
    return out


def run_cp(rank: int, world: int) -> dict:
    import posenc

    x = cp_input()  # [B, L, dim], the same on every rank
    out: dict = {"outputs": {}}
    for kv in CP_KV_HEADS:
        layer = CPLayer(kv)
        for name in CP_SCHEMES:
            scheme = cp_scheme(name)
            for balance in (True, False):
                pos = posenc.shard_positions(CP_LEN, rank, world, load_balance=balance)  # [L / W]
                with torch.no_grad():
                    q, k, v = layer(x[:, pos])  # this rank's tokens only
                    k_all, v_all = _gather(k, world, 2), _gather(v, world, 2)  # unrotated
                    key_pos = _gather(pos, world, 0)  # [L]: the order the keys arrived in
                    y = posenc.attend(q, k_all, v_all, scheme, positions=pos, key_positions=key_pos)
                out["outputs"][(kv, name, balance)] = {"pos": pos, "key_pos": key_pos, "y": y}
    out["torch_cp"] = torch_context_parallel(rank, world)
    return out


def torch_context_parallel(rank: int, world: int) -> str:
    """What torch's ``context_parallel`` does around CPU SDPA: 'ok' or the error's text."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
    except ImportError as e:
        return f"ImportError: {e}"
    try:
        mesh = init_device_mesh("cpu", (world,))
        g = torch.Generator().manual_seed(5)
        q, k, v = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    except Exception as e:  # noqa: BLE001  (recorded, the test reads it)
        return f"{type(e).__name__}: {e}"
    return "ok"


SCENARIOS = {"fsdp": run_fsdp, "cp": run_cp}


def main(argv: list[str]) -> int:
    scenarios, rank, world, port, out_dir = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        for scenario in scenarios.split(","):
            t0 = time.perf_counter()
            try:
                result = {"ok": True, **SCENARIOS[scenario](rank, world)}
            except Exception:  # noqa: BLE001  (the test shows the traceback)
                result = {"ok": False, "error": traceback.format_exc()}
            result["seconds"] = time.perf_counter() - t0
            torch.save(result, os.path.join(out_dir, f"{scenario}_rank{rank}.pt"))
            dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
