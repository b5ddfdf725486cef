"""A model that trains with dropout runs in checked mode, through the Triton overrides (under
Triton's interpreter), without a false alarm, and draws what it draws unchecked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TRAIN = r'''
import json, torch, torch.nn as nn, torch.nn.functional as F
import python_native as pn

class NativeDropout(nn.Module):  # the op F.dropout reaches on GPUs, with its backward
    def forward(self, x):
        return torch.native_dropout(x, 0.2, self.training)[0]

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)
        self.drop, self.native_drop, self.norm = nn.Dropout(0.25), NativeDropout(), nn.LayerNorm(32)

    def forward(self, x):
        h = self.norm(self.native_drop(self.drop(F.gelu(self.fc1(x)))))
        logits = self.fc2(h)
        top = torch.topk(logits.detach().round(), 2, dim=-1)  # ties: rounded scores
        gate = torch.zeros_like(logits).scatter(-1, top.indices, 1.0)
        return F.log_softmax(logits.softmax(-1) + gate, -1)

torch.manual_seed(0)
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x, y = torch.randn(64, 16), torch.randint(0, 8, (64,))
losses = []
with pn.trace() as t:
    for _ in range(3):
        opt.zero_grad()
        loss = F.nll_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    ties = torch.tensor([[1.0, 3.0, 3.0, float("nan"), 3.0], [0.0, 0.0, 5.0, 5.0, -1.0]])
    for largest in (True, False):
        torch.topk(ties, 3, largest=largest, sorted=False)
    torch.topk(ties, 2, out=(torch.empty(0), torch.empty(0, dtype=torch.int64)))
    torch.max(ties.nan_to_num(), 1)
    for dtype in (torch.float16, torch.bfloat16):
        for p in (0.0, 0.5, 1.0):
            torch.native_dropout(torch.randn(40, 24, dtype=dtype), p, True)
    torch.empty(4096).bernoulli_(0.3, generator=torch.Generator().manual_seed(5))
fired = sorted({e.op for e in t.events if e.outcome == "override" and e.dsl == "triton"})
print(json.dumps({"losses": losses, "fired": fired}))
'''


def _train(check: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1",
           "PYTHON_NATIVE_CHECK": check}
    r = subprocess.run([sys.executable, "-c", TRAIN], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_model_training_with_dropout_runs_checked_and_draws_as_unchecked():
    checked = _train("1")
    expected = {"bernoulli_.float", "native_dropout", "native_dropout_backward", "topk", "native_layer_norm",
                "_softmax", "_log_softmax", "max.dim"}
    assert expected <= set(checked["fired"]), checked["fired"]
    assert checked["losses"] == _train("0")["losses"]  # checking changed no random stream
