"""posenc under torch.distributed: FSDP2 and the positions part of context parallelism.

Two gloo processes on 127.0.0.1 (``tests/_dist_worker.py``, one thread each, no network) run
every scenario once per test session and save what they computed; each test here recomputes
the same thing in one process and compares:

- FSDP2 (``torch.distributed.fsdp.fully_shard``) over ``posenc.lab.model.TransformerLM``
  (RoPE, every block sharded; T5, whose one bias table all blocks share, sharded at the root),
  each rank on half the batch: the loss, the full gradients, each rank's gradient shard (dim-0
  chunk of the full gradient) and the parameters after one AdamW step equal one process's.
- Context parallelism (issue 15 §5b): each rank holds the head-tail shard
  ``posenc.shard_positions(L, rank, 2)`` (and the contiguous one), projects its own q, k, v,
  all-gathers the unrotated k, v and the key positions, and ``attend(..., positions=,
  key_positions=)`` gives the single-process rows for RoPE, ALiBi and T5, with 4, 2 and 1 kv
  heads. torch's own ``context_parallel`` refuses CPU SDPA, as the issue says.

The session's two processes start once (``filelock``: xdist workers share one run).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import posenc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import _dist_worker as W  # noqa: E402

WORLD = 2
SCENARIOS = ("fsdp", "cp")

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The single-process references are tiny: one thread (two threads on a busy 2-core machine
    wait on each other); restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out_dir: Path) -> None:
    """Start the two ranks, wait for both; retry with a new port if one was taken meanwhile."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only: never a real network device
    errors = []
    for _attempt in range(3):
        port = _free_port()
        procs = [
            subprocess.Popen(
                [sys.executable, str(HERE / "_dist_worker.py"), ",".join(SCENARIOS), str(rank),
                 str(WORLD), str(port), str(out_dir)],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            for rank in range(WORLD)
        ]
        logs = []
        for p in procs:
            try:
                logs.append(p.communicate(timeout=300)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                pytest.fail("the 2-process run did not finish within 300 s")
        if all(p.returncode == 0 for p in procs):
            return
        errors.append("\n".join(f"--- rank {r} (exit {p.returncode})\n{log[-4000:]}"
                                for r, (p, log) in enumerate(zip(procs, logs, strict=True))))
        if "address already in use" not in errors[-1].lower():
            break
        time.sleep(1)
    pytest.fail("the 2-process run failed:\n" + errors[-1])


@pytest.fixture(scope="session")
def dist_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, float]:
    """``{(scenario, rank): result}`` and the run's wall seconds (one run per session)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "posenc_dist"  # one dir for all workers
    else:
        shared = tmp_path_factory.mktemp("posenc_dist")
    shared.mkdir(exist_ok=True)
    try:
        from filelock import FileLock
        lock = FileLock(str(shared / "run.lock"))
    except ImportError:  # no lock: each worker runs its own pair
        import contextlib
        lock = contextlib.nullcontext()
        shared = tmp_path_factory.mktemp("posenc_dist")
    with lock:
        done = shared / "done"
        t0 = time.perf_counter()
        if not done.exists():
            _launch(shared)
            done.write_text(f"{time.perf_counter() - t0:.1f}")
        seconds = float(done.read_text())
    results = {(s, r): torch.load(shared / f"{s}_rank{r}.pt", weights_only=False)
               for s in SCENARIOS for r in range(WORLD)}
    return results, seconds


def _result(dist_run: tuple[dict, float], scenario: str, rank: int) -> dict:
    res = dist_run[0][(scenario, rank)]
    if not res["ok"]:
        pytest.fail(f"rank {rank} failed in {scenario!r}:\n{res['error']}")
    return res


def test_both_ranks_ran_every_scenario(dist_run: tuple[dict, float]) -> None:
    """Both ranks finished every scenario without an error (the run's wall time, about 20 s on
    a busy 2-core machine, is the fixture's; no timed assertion)."""
    for s in SCENARIOS:
        for r in range(WORLD):
            res = _result(dist_run, s, r)
            assert res["seconds"] > 0


# ---- FSDP2 ---------------------------------------------------------------------------------


def _single_process_step(name: str) -> tuple[torch.Tensor, dict, dict]:
    """Loss over the whole batch, full gradients and the parameters after one AdamW step."""
    model = W.fsdp_model(name)
    opt = W.make_optimizer(model)
    tokens, targets = W.fsdp_batch(name)
    loss = model.loss(tokens, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    return loss.detach(), grads, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", sorted(W.FSDP_MODELS))
def test_fsdp2_gives_single_process_gradients(dist_run: tuple[dict, float], name: str) -> None:
    loss, grads, after = _single_process_step(name)
    ranks = [_result(dist_run, "fsdp", r)[name] for r in range(WORLD)]
    # each rank's loss is the mean over its half of the batch; equal halves: their mean is ours
    torch.testing.assert_close(sum(r["loss"] for r in ranks) / WORLD, loss)
    assert ranks[0]["loss"] != ranks[1]["loss"]  # the ranks really saw different rows
    assert set(ranks[0]["kinds"].values()) == {"DTensor"}, ranks[0]["kinds"]  # all sharded
    assert set(ranks[0]["grads"]) == set(grads)
    if name == "t5":
        assert "scheme.rel.embedding.weight" in grads  # the position table trains too
        assert grads["scheme.rel.embedding.weight"].abs().sum() > 0
    for r, res in enumerate(ranks):
        for pname, g in grads.items():
            torch.testing.assert_close(res["grads"][pname], g, msg=f"rank {r}: grad of {pname}")
            # FSDP2 shards dim 0: rank r holds chunk r of the gradient
            torch.testing.assert_close(
                res["local"][pname], torch.chunk(g, WORLD, dim=0)[r],
                msg=f"rank {r}: local gradient shard of {pname}",
            )
            torch.testing.assert_close(res["after"][pname], after[pname], atol=1e-5, rtol=1e-5,
                                       msg=f"rank {r}: {pname} after one AdamW step")


# ---- context parallelism, the positions part ---------------------------------------------


def _reference(kv: int, name: str) -> torch.Tensor:
    """The single-process output ``[B, H, L, Dh]``, with every kv head repeated (plain MHA)."""
    layer, scheme = W.CPLayer(kv), W.cp_scheme(name)
    with torch.no_grad():
        q, k, v = layer(W.cp_input())
        g = W.CP_HEADS // kv
        return posenc.attend(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), scheme)


CP_CASES = [(kv, name, balance) for kv in W.CP_KV_HEADS for name in W.CP_SCHEMES
            for balance in (True, False)]


@pytest.mark.parametrize(("kv", "name", "balance"), CP_CASES,
                         ids=[f"{n}-kv{kv}-{'headtail' if b else 'contiguous'}" for kv, n, b in CP_CASES])
def test_context_parallel_rows_equal_single_process(
    dist_run: tuple[dict, float], kv: int, name: str, balance: bool
) -> None:
    ref = _reference(kv, name)  # [B, H, L, Dh]
    L = W.CP_LEN
    seen = []
    for r in range(WORLD):
        out = _result(dist_run, "cp", r)["outputs"][(kv, name, balance)]
        pos, key_pos = out["pos"], out["key_pos"]
        torch.testing.assert_close(pos, posenc.shard_positions(L, r, WORLD, load_balance=balance))
        torch.testing.assert_close(out["y"], ref[:, :, pos], msg=f"rank {r}: rows {pos.tolist()}")
        assert sorted(key_pos.tolist()) == list(range(L))  # every key once
        seen.append(pos)
    assert sorted(torch.cat(seen).tolist()) == list(range(L))  # the shards cover the sequence
    if balance:  # head-tail: the gathered keys are not in position order, so index != position
        assert key_pos.tolist() != list(range(L))


@pytest.mark.parametrize("name", W.CP_SCHEMES)
def test_context_parallel_needs_key_positions(name: str) -> None:
    """The same gathered keys with their *indices* as positions (what a scheme that ignores
    positions would do) give other rows: the test above would catch it."""
    layer, scheme = W.CPLayer(W.CP_HEADS), W.cp_scheme(name)
    ref = _reference(W.CP_HEADS, name)
    with torch.no_grad():
        q, k, v = layer(W.cp_input())
    shards = [posenc.shard_positions(W.CP_LEN, r, WORLD) for r in range(WORLD)]
    order = torch.cat(shards)  # the gathered keys' positions
    pos = shards[0]
    with torch.no_grad():
        right = posenc.attend(q[:, :, pos], k[:, :, order], v[:, :, order], scheme,
                              positions=pos, key_positions=order)
        wrong = posenc.attend(q[:, :, pos], k[:, :, order], v[:, :, order], scheme,
                              positions=pos, key_positions=torch.arange(W.CP_LEN))
    torch.testing.assert_close(right, ref[:, :, pos])
    assert (wrong - ref[:, :, pos]).abs().max() > 1e-2


def test_torch_context_parallel_refuses_cpu_sdpa(dist_run: tuple[dict, float]) -> None:
    """Why §5b tests the positions part only: torch's ``context_parallel`` patches the CUDA
    SDPA kernels; around CPU SDPA it raises."""
    for r in range(WORLD):
        msg = _result(dist_run, "cp", r)["torch_cp"]
        assert "_scaled_dot_product_flash_attention_for_cpu" in msg, msg
        assert "sharding strategy" in msg, msg
