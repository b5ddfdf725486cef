"""torch.distributed with the overrides on: DDP, FSDP2 and DTensor (Shard and Replicate) on two gloo
ranks on CPU, Triton's kernels through its interpreter.

One two-rank job runs every scenario (each rank imports torch and compiles its kernels once), with
the overrides on and then off, and prints what each rank saw; the tests read that. A second job
patches a tiny Llama (``pn.patch``) before and after FSDP2's ``fully_shard`` and trains it one step;
a third patches one under tensor parallelism (``parallelize_module``, colwise and rowwise plans).
Bounded in time: a rank that hangs fails the tests instead of the suite.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
WORLD = 2
TIMEOUT = 240  # seconds for the whole job; it takes about 30 on two busy cores

pytestmark = [
    pytest.mark.slow,  # a two-rank job: CI's second step runs it
    pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                       reason="torch.distributed with gloo is not available"),
]

RANK = r"""
import contextlib, json, os
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
import python_native as pn
from torch.distributed.device_mesh import init_device_mesh

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
out = {"rank": rank}


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 16), nn.SiLU())


def batch(step):
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * step + rank))


def train(m, scope, params):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with scope, pn.trace() as t:
        for step in range(2):
            loss = F.log_softmax(m(batch(step)), -1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [p.detach().clone() for p in params(m)], sorted(set(t.ops("override")))


def same(a, b):
    return all(torch.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a, b, strict=True))


def gathered(tensors):
    flat = torch.cat([t.flatten() for t in tensors])
    every = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat)
    return all(torch.equal(every[0], e) for e in every)


# DDP: gradients all-reduced over the overridden backward ops; ranks stay in step.
ddp = lambda: nn.parallel.DistributedDataParallel(model())  # noqa: E731
on, fired = train(ddp(), contextlib.nullcontext(), lambda m: m.parameters())
off, fired_off = train(ddp(), pn.triton.disabled(), lambda m: m.parameters())
out["ddp"] = {"fired": fired, "fired_off": fired_off, "equal_off": same(on, off), "ranks_agree": gathered(on)}


# FSDP2: parameters sharded over the ranks, gathered for each layer's forward and backward.
def fsdp():
    from torch.distributed.fsdp import fully_shard

    m = model()
    for layer in m:
        if list(layer.parameters()):
            fully_shard(layer, mesh=mesh)
    return fully_shard(m, mesh=mesh)


full = lambda m: [p.full_tensor() for p in m.parameters()]  # noqa: E731
on, fired = train(fsdp(), contextlib.nullcontext(), full)
off, fired_off = train(fsdp(), pn.triton.disabled(), full)
out["fsdp2"] = {"fired": fired, "fired_off": fired_off, "equal_off": same(on, off), "ranks_agree": gathered(on)}

# DTensor: each rank's shard (or replica) goes through the overrides; the whole matches aten.
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
with pn.triton.disabled():
    ref_softmax, ref_norm = F.softmax(x, -1), F.layer_norm(x, (8,))
out["dtensor"] = {}
for placement in (Shard(0), Shard(1), Replicate()):
    d = distribute_tensor(x, mesh, [placement])
    with pn.trace() as t:
        y, z = F.softmax(d, -1), F.layer_norm(d, (8,))
    out["dtensor"][str(placement)] = {
        "fired": sorted(set(t.ops("override"))),
        "equal": torch.allclose(y.full_tensor(), ref_softmax) and torch.allclose(z.full_tensor(), ref_norm, atol=1e-6),
    }

# A switch is per process: rank 1 turns Triton off, rank 0 keeps routing.
if rank == 1:
    pn.triton.enabled = False
dist.barrier()
with pn.trace() as t:
    F.softmax(x, -1)
out["toggle"] = {"fired": t.ops("override"), "enabled": pn.triton.enabled}
dist.barrier()
pn.triton.enabled = True
dist.destroy_process_group()
print(json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PATCH_RANK = r"""
import json, os
import torch, torch.distributed as dist
import python_native as pn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from python_native.tools import tiny_models

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (world,))
llama = lambda: tiny_models.build("llama")  # noqa: E731
batch = tiny_models.example_inputs(llama(), batch=2, seq=16, seed=rank)  # each rank its own tokens


def shard(m):
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(m, mesh=mesh)


def entries(report):  # fully_shard renames the class it takes (FSDPLlamaForCausalLM)
    unwrap = lambda name: name.removeprefix("FSDP")  # noqa: E731
    return sorted([e.rule, unwrap(e.target), e.status, e.detail, [unwrap(n) for n in e.modules]] for e in report.entries)


# The unsharded, unpatched model: each rank's loss, and the gradients averaged over the ranks (as FSDP's).
ref = llama()
with pn.triton.disabled():
    ref_loss = ref(**batch).loss
    ref_loss.backward()
ref_grads = {}
for n, p in ref.named_parameters():
    dist.all_reduce(p.grad)
    ref_grads[n] = p.grad / world

unsharded = llama()
before = llama()
reports = {"unsharded": pn.patch(unsharded, dry_run=True), "before": pn.patch(before)}
shard(before)
after = shard(llama())
reports["after"] = pn.patch(after)
out = {"rank": rank, "reports": {k: entries(r) for k, r in reports.items()}}
for name, m in (("before", before), ("after", after)):
    with pn.trace() as t:
        loss = m(**batch).loss
        loss.backward()
    out[name] = {
        "loss": [loss.item(), ref_loss.item()],
        "grads_apart": [n for n, p in m.named_parameters()
                        if not torch.allclose(p.grad.full_tensor(), ref_grads[n], rtol=1e-4, atol=1e-6)],
        "grads": len(ref_grads),
        "served": sorted({(e.op, (e.module or "").removeprefix("FSDP")) for e in t.events if e.outcome == "override"}),
        "unpatched": pn.unpatch(m),
    }
# DDP over a patched model: the gradients of the overridden backwards are all-reduced as any others.
ddp_model = llama()
pn.patch(ddp_model)
ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
with pn.trace() as t:
    loss = ddp(**batch).loss
    loss.backward()
out["ddp"] = {
    "loss": [loss.item(), ref_loss.item()],
    "grads_apart": [n for n, p in ddp_model.named_parameters()
                    if not torch.allclose(p.grad, ref_grads[n], rtol=1e-4, atol=1e-6)],
    "grads": len(ref_grads),
    "served": sorted({(e.op, e.module or "") for e in t.events if e.outcome == "override"}),
    "unpatched": pn.unpatch(ddp_model),
}
dist.destroy_process_group()
print(json.dumps(out))
"""


TP_RANK = r"""
import json, os
import torch, torch.distributed as dist
import python_native as pn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from python_native.tools import tiny_models

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (world,))
llama = lambda: tiny_models.build("llama", num_hidden_layers=1)  # noqa: E731
batch = tiny_models.example_inputs(llama(), batch=2, seq=16, seed=0)  # tensor parallel: one batch on every rank
ATTENTION = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
             "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
             "mlp.down_proj": RowwiseParallel()}
PLANS = {  # the MLP's gate and up hand on their local shards, or DTensors sharded on the inner dim
    "local": {"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel()},
    "dtensor": {"mlp.gate_proj": ColwiseParallel(use_local_output=False),
                "mlp.up_proj": ColwiseParallel(use_local_output=False)},
}

ref = llama()
with pn.triton.disabled():
    ref_loss = ref(**batch).loss
    ref_loss.backward()
out = {"rank": rank}
for name, plan in PLANS.items():
    m = llama()
    for layer in m.model.layers:
        parallelize_module(layer, mesh, {**ATTENTION, **plan})
    report = pn.patch(m)
    with pn.trace() as t:
        loss = m(**batch).loss
        loss.backward()
    grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for n, p in m.named_parameters()}
    out[name] = {
        "rules": sorted(e.rule for e in report.patched), "left_alone": [e.detail for e in report.left_alone],
        "loss": [loss.item(), ref_loss.item()],
        "grads_apart": [n for n, p in ref.named_parameters() if not torch.allclose(grads[n], p.grad, rtol=1e-4, atol=1e-6)],
        "served": sorted({(e.op, e.module or "") for e in t.events if e.outcome == "override"}),
    }

# A vocabulary-parallel output projection: the fused loss cannot take its sharded weight and says so.
from torch.distributed.tensor import Replicate

m = llama()
parallelize_module(m, mesh, {"lm_head": ColwiseParallel(output_layouts=Replicate())})
report = pn.patch(m)
loss = m(**batch).loss
out["parallel_head"] = {"loss": [loss.item(), ref_loss.item()], "rules": sorted(e.rule for e in report.patched),
                        "left_alone": {e.rule: e.detail for e in report.left_alone}}

# Sequence parallelism: a patched norm gets a DTensor sharded on the sequence dim, its weight replicated.
from torch.distributed.tensor.parallel import SequenceParallel
from transformers.models.llama.modeling_llama import LlamaRMSNorm

torch.manual_seed(0)
norm = torch.nn.Sequential(LlamaRMSNorm(64))
with torch.no_grad():
    norm[0].weight.normal_(1.0, 0.5)
x = torch.randn(2, 8, 64)
with pn.triton.disabled():
    whole = x.clone().requires_grad_()
    want = norm(whole)
    want.backward(torch.ones_like(want))
weight_grad, norm[0].weight.grad = norm[0].weight.grad, None
parallelize_module(norm, mesh, {"0": SequenceParallel()})
report = pn.patch(norm)
mine = x.chunk(world, dim=1)[rank].clone().requires_grad_()  # this rank's part of the sequence
with pn.trace() as t:
    got = norm(mine)
    got.backward(torch.ones_like(got))
out["sequence_parallel"] = {
    "rules": sorted(e.rule for e in report.patched), "output": type(got).__name__,
    "equal": torch.allclose(got.full_tensor(), want, rtol=1e-5, atol=1e-6),
    "grad_input": torch.allclose(mine.grad, whole.grad.chunk(world, dim=1)[rank], rtol=1e-5, atol=1e-6),
    "grad_weight": torch.allclose(norm[0].weight.grad.full_tensor(), weight_grad, rtol=1e-5, atol=1e-5),
    "served": sorted({e.op for e in t.events if e.outcome == "override"}),
}

# rotary on DTensors, q and k sharded on the heads or the batch (its strategies registered by pn.patch above).
from torch.distributed.tensor import Shard, distribute_tensor
from python_native.ops import rotary_op

g = torch.Generator().manual_seed(1)
q, k, cos, sin = (torch.randn(*shape, generator=g) for shape in ((2, 4, 8, 16), (2, 2, 8, 16), (2, 8, 16), (2, 8, 16)))
plain = [t.clone().requires_grad_() for t in (q, k)]
with pn.triton.disabled():
    want = rotary_op._reference(*plain, cos, sin)
    (want[0].sum() + want[1].sum()).backward()
out["rotary"] = {}
for name, (qk, table) in {"heads": (Shard(1), Replicate()), "batch": (Shard(0), Shard(0))}.items():
    dq, dk = (distribute_tensor(t, mesh, [qk]).requires_grad_() for t in (q, k))
    dcos, dsin = (distribute_tensor(t, mesh, [table]) for t in (cos, sin))
    with pn.trace() as t:
        got = rotary_op.rotary(dq, dk, dcos, dsin)
        (got[0].sum() + got[1].sum()).backward()
    out["rotary"][name] = {
        "placements": [str(p) for r in got for p in r.placements],
        "equal": all(torch.allclose(r.full_tensor(), w, atol=1e-6) for r, w in zip(got, want)),
        "grads": all(torch.allclose(d.grad.full_tensor(), p.grad, atol=1e-6) for d, p in zip((dq, dk), plain)),
        "served": sorted({e.op for e in t.events if e.outcome == "override"}),
    }
dist.destroy_process_group()
print(json.dumps(out))
"""


def _launch(script: str) -> list[dict]:
    """Run ``script`` on two gloo ranks; each rank's report (its last line of output, JSON)."""
    port = str(_free_port())
    procs = []
    for rank in range(WORLD):
        environ = {
            **os.environ, "PYTHONPATH": str(ROOT), "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": str(WORLD),
            "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1",
        }
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=environ, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    reports = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 0, stderr[-4000:]
            reports.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return sorted(reports, key=lambda r: r["rank"])


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """Run the two-rank job once for the module; each rank's report."""
    return _launch(RANK)


@pytest.fixture(scope="module")
def patched_ranks() -> list[dict]:
    """Run the two-rank patching job once for the module; each rank's report."""
    pytest.importorskip("transformers")
    return _launch(PATCH_RANK)


@pytest.fixture(scope="module")
def tp_ranks() -> list[dict]:
    """Run the two-rank tensor-parallel job once for the module; each rank's report."""
    pytest.importorskip("transformers")
    return _launch(TP_RANK)


LOSS_OPS = ["_log_softmax", "_log_softmax_backward_data", "gelu", "gelu_backward", "native_layer_norm",
            "native_layer_norm_backward", "silu", "silu_backward", "sum.dim_IntList"]  # sum: the loss's reduction


@pytest.mark.parametrize("scenario", ["ddp", "fsdp2"])
def test_training_fires_the_overrides_on_every_rank_and_matches_aten(ranks, scenario):
    for report in ranks:
        seen = report[scenario]
        assert seen["fired"] == LOSS_OPS, (report["rank"], seen)
        assert seen["fired_off"] == [] and seen["equal_off"] and seen["ranks_agree"], (report["rank"], seen)


def test_dtensor_shards_and_replicas_go_through_the_overrides(ranks):
    for report in ranks:
        for placement, seen in report["dtensor"].items():
            assert seen["fired"] == ["_softmax", "native_layer_norm"], (report["rank"], placement, seen)
            assert seen["equal"], (report["rank"], placement)


def test_a_switch_stays_on_its_rank(ranks):
    assert ranks[0]["toggle"] == {"fired": ["_softmax"], "enabled": True}
    assert ranks[1]["toggle"] == {"fired": [], "enabled": False}


PATCH_RULES = ["causal_lm_loss", "gated_mlp", "rms_norm", "rotary"]


def test_patching_after_fully_shard_reports_what_patching_before_does(patched_ranks):
    for report in patched_ranks:
        reports = report["reports"]
        assert reports["after"] == reports["before"], (report["rank"], reports)
        assert [[rule, detail] for rule, _, _, detail, _ in reports["after"]] == [
            [rule, detail] for rule, _, _, detail, _ in reports["unsharded"]]  # as a dry run of the model unsharded
        assert [(rule, status) for rule, _, status, _, _ in reports["after"]] == [(r, "patched") for r in PATCH_RULES]


@pytest.mark.parametrize("when", ["before", "after", "ddp"])
def test_a_sharded_patched_llama_trains_as_the_unsharded_unpatched_one(patched_ranks, when):
    """Patched, then sharded by FSDP2 (``before``), sharded then patched (``after``), or patched
    and wrapped in DDP (``ddp``): each rank's loss and the reduced gradients are the unpatched model's."""
    for report in patched_ranks:
        seen = report[when]
        loss, want = seen["loss"]
        assert abs(loss - want) <= 1e-5 * abs(want), (report["rank"], seen["loss"])
        assert seen["grads"] > 0 and seen["grads_apart"] == [], (report["rank"], seen["grads_apart"])
        served = {tuple(s) for s in seen["served"]}
        for op, module in [("swiglu", "model.layers.1.mlp"), ("rms_norm", "model.layers.0.input_layernorm"),
                           ("rotary", "model.layers.1.self_attn"), ("linear_cross_entropy.forward", "LlamaForCausalLM")]:
            backward = op.replace("forward", "backward") if "." in op else f"{op}_backward"
            assert {(op, module), (backward, module)} <= served, (report["rank"], op, served)
        assert seen["unpatched"]


@pytest.mark.parametrize("plan", ["local", "dtensor"])
def test_a_tensor_parallel_patched_llama_trains_as_the_unsharded_unpatched_one(tp_ranks, plan):
    """Local shards reach the ops as plain tensors; DTensors reach the gated op through its
    sharding strategies. Either way every rule takes its modules and the overrides serve them."""
    for report in tp_ranks:
        seen = report[plan]
        assert seen["rules"] == PATCH_RULES and seen["left_alone"] == [], (report["rank"], seen)
        loss, want = seen["loss"]
        assert abs(loss - want) <= 1e-5 * abs(want), (report["rank"], seen["loss"])
        assert seen["grads_apart"] == [], (report["rank"], seen["grads_apart"])
        served = {tuple(s) for s in seen["served"]}
        assert {("swiglu", "model.layers.0.mlp"), ("swiglu_backward", "model.layers.0.mlp"),
                ("rms_norm", "model.layers.0.input_layernorm"), ("rotary", "model.layers.0.self_attn")} <= served, served


def test_a_patched_norm_takes_sequence_parallel_dtensors(tp_ranks):
    """``rms_norm``'s sharding strategies: rows sharded, the weight replicated, its gradient summed."""
    for report in tp_ranks:
        assert report["sequence_parallel"] == {
            "rules": ["rms_norm"], "output": "DTensor", "equal": True, "grad_input": True, "grad_weight": True,
            "served": ["rms_norm", "rms_norm_backward"]}, report["rank"]


def test_a_vocabulary_parallel_head_keeps_its_own_loss_and_the_report_says_why(tp_ranks):
    for report in tp_ranks:
        seen = report["parallel_head"]
        loss, want = seen["loss"]
        assert abs(loss - want) <= 1e-5 * abs(want), (report["rank"], seen)
        assert seen["rules"] == ["gated_mlp", "rms_norm", "rotary"], seen
        assert "mixed torch.Tensor and DTensor" in seen["left_alone"]["causal_lm_loss"], seen


def test_rotary_takes_dtensors_sharded_on_heads_or_batch(tp_ranks):
    for report in tp_ranks:
        for name, placement in (("heads", "S(1)"), ("batch", "S(0)")):
            assert report["rotary"][name] == {"placements": [placement, placement], "equal": True, "grads": True,
                                              "served": ["rotary", "rotary_backward"]}, (report["rank"], name)
