# coil fuzz repro seed 1016 index 980
# running on backend cpp+grad: 
import torch
from math import inf, nan


def fn(a):
    a.squeeze_(0)
    v0 = a - 0
    v1 = a.transpose(-1, -2)
    v2 = a.squeeze(-1)
    a.squeeze_()
    v3 = torch.nansum(v2, dim=0)
    v4 = torch.var(v1, correction=0)
    return (v0, v1, v3, v4)


def make_inputs():
    a = torch.tensor([[-1.81], [2.75], [-2.06], [-inf], [3.28]], dtype=torch.bfloat16)
    return [a]


if __name__ == "__main__":
    from coil.testing.fuzz import replay
    replay(fn, make_inputs, 'cpp+grad')
