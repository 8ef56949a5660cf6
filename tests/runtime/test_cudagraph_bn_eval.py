"""BatchNorm trained under mode="reduce-overhead", then evaluated: the eval graph reads the running statistics the
training replays wrote (a user probe on the H100 found eval outputs 0.09 off)."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import coil
from test_cudagraph_trees import fake_cuda  # noqa: F401  (fixture)


def test_eval_after_training_reads_the_trained_running_statistics(fake_cuda):  # noqa: F811
    torch.manual_seed(10)
    em = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                       nn.Conv2d(8, 8, 3, stride=2), nn.BatchNorm2d(8),
                       nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    cmod = copy.deepcopy(em)
    cm = coil.compile(cmod, mode="reduce-overhead")
    eo, co = torch.optim.SGD(em.parameters(), lr=0.1), torch.optim.SGD(cmod.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(4, 3, 12, 12), torch.randint(0, 5, (4,))
        F.cross_entropy(em(x), y).backward()
        F.cross_entropy(cm(x), y).backward()
        for o in (eo, co):
            o.step()
            o.zero_grad()
        for (n, bc), (_, be) in zip(cmod.named_buffers(), em.named_buffers()):
            torch.testing.assert_close(bc, be, rtol=1e-4, atol=1e-5, msg=n)
    em.eval()
    cm.eval()
    with torch.no_grad():
        for k in range(3):
            x = torch.randn(2, 3, 12, 12)
            torch.testing.assert_close(cm(x), em(x), rtol=1e-4, atol=1e-5, msg=f"eval call {k}")
