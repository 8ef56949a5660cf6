# coil call-sequence fuzz repro: seed 406 index 11, backend mark ({'dynamic': False})
# running at call 0 (first): 
import torch
import coil
from math import inf, nan


def fn(a, b, c, d):
    a.add_(d)
    v0 = a.unflatten(-4, (1, -1))
    v1 = torch.exp(b)
    v2 = torch.scatter_reduce(v1, 2, torch.tensor([[[[0, 1], [1, 0]], [[0, 1], [1, 1]], [[1, 1], [0, 0]]]], dtype=torch.int64), v1, 'sum', include_self=False)
    v3 = torch.nansum(b)
    v4 = c.masked_fill(v3 < 1, 2.5)
    return (v0, v2, v4)


def call_0():  # first
    a = torch.tensor([[[[-2.48, -2.02, -0.291]], [[-0.84, -2.31, 1.61]], [[-3.36, 0.445, 2.38]]]], dtype=torch.bfloat16).permute(2, 3, 0, 1)
    b = torch.tensor([[[[1.64, -2.55e+38, 1.156e+38], [-1.38e-39, 9.77e+37, -3.58e-39]]]], dtype=torch.bfloat16).expand(1, 3, 2, 3)
    c = torch.tensor([[[[-0.32], [3.34]], [[2.91], [-1.13]], [[-0.18], [-2.81]]]], dtype=torch.bfloat16)
    d = torch.tensor([[[[1.336, 1.22, 0.781], [-1.18, -1.586, -0.715]], [[1.875, 0.676, 2.3], [-2.36, 0.648, -0.461]], [[-2.17, -0.324, -2.88], [-0.162, 1.75, 1.22]]]], dtype=torch.bfloat16)[:, :, 0:2:2]
    coil.mark_dynamic(a, 3)
    coil.mark_dynamic(b, 2)
    coil.mark_dynamic(b, 3)
    coil.mark_dynamic(c, 2)
    coil.mark_dynamic(d, 3)
    return [a, b, c, d]


def call_1():  # layout
    a = torch.tensor([[[[-2.48, -2.02, -0.291]], [[-0.84, -2.31, 1.61]], [[-3.36, 0.445, 2.38]]]], dtype=torch.bfloat16).permute(2, 3, 0, 1)
    b = torch.tensor([[[[99.0, 99.0, 99.0], [1.64, -2.55e+38, 1.156e+38], [-1.38e-39, 9.77e+37, -3.58e-39]], [[99.0, 99.0, 99.0], [1.64, -2.55e+38, 1.156e+38], [-1.38e-39, 9.77e+37, -3.58e-39]], [[99.0, 99.0, 99.0], [1.64, -2.55e+38, 1.156e+38], [-1.38e-39, 9.77e+37, -3.58e-39]]]], dtype=torch.bfloat16)[:, :, 1:3]
    c = torch.tensor([[[[-0.32], [3.34]], [[2.91], [-1.13]], [[-0.18], [-2.81]]]], dtype=torch.bfloat16)
    d = torch.tensor([[[[1.336, 1.22, 0.781]], [[1.875, 0.676, 2.3]], [[-2.17, -0.324, -2.88]]]], dtype=torch.bfloat16)
    return [a, b, c, d]


def call_2():  # layout
    a = torch.tensor([[[[-2.48, -2.02, -0.291]], [[-0.84, -2.31, 1.61]], [[-3.36, 0.445, 2.38]]]], dtype=torch.bfloat16).permute(2, 3, 0, 1)
    b = torch.tensor([[[[1.64, 1.64, 1.64]], [[-1.38e-39, -1.38e-39, -1.38e-39]]], [[[-2.55e+38, -2.55e+38, -2.55e+38]], [[9.77e+37, 9.77e+37, 9.77e+37]]], [[[1.156e+38, 1.156e+38, 1.156e+38]], [[-3.58e-39, -3.58e-39, -3.58e-39]]]], dtype=torch.bfloat16).permute(2, 3, 1, 0)
    c = torch.tensor([[[[-0.32], [3.34]], [[2.91], [-1.13]], [[-0.18], [-2.81]]]], dtype=torch.bfloat16)
    d = torch.tensor([[[[1.336, 1.22, 0.781]], [[1.875, 0.676, 2.3]], [[-2.17, -0.324, -2.88]]]], dtype=torch.bfloat16)
    return [a, b, c, d]


def call_3():  # values
    a = torch.tensor([[[[-2.31, -2.48, -0.291]], [[-3.36, 0.445, -2.31]], [[1.61, 0.445, -3.36]]]], dtype=torch.bfloat16).permute(2, 3, 0, 1)
    b = torch.tensor([[[[1.156e+38, -1.38e-39, -1.38e-39]], [[1.64, -3.58e-39, 1.156e+38]]], [[[1.156e+38, 1.156e+38, -1.38e-39]], [[-2.55e+38, 1.64, 9.77e+37]]], [[[1.64, -1.38e-39, -3.58e-39]], [[9.77e+37, 1.156e+38, -3.58e-39]]]], dtype=torch.bfloat16).permute(2, 3, 1, 0)
    c = torch.tensor([[[[-0.18], [3.34]], [[-2.81], [-0.18]], [[3.34], [3.34]]]], dtype=torch.bfloat16)
    d = torch.tensor([[[[-2.36, 2.3, 1.22]], [[0.676, 0.781, -2.36]], [[1.75, -2.36, -0.162]]]], dtype=torch.bfloat16)
    return [a, b, c, d]


def call_4():  # back
    a = torch.tensor([[[[-2.48, -2.02, -0.291]], [[-0.84, -2.31, 1.61]], [[-3.36, 0.445, 2.38]]]], dtype=torch.bfloat16).permute(2, 3, 0, 1)
    b = torch.tensor([[[[99.0, 99.0, 99.0], [1.64, -2.55e+38, 1.156e+38], [-1.38e-39, 9.77e+37, -3.58e-39]], [[99.0, 99.0, 99.0], [1.64, -2.55e+38, 1.156e+38], [-1.38e-39, 9.77e+37, -3.58e-39]], [[99.0, 99.0, 99.0], [1.64, -2.55e+38, 1.156e+38], [-1.38e-39, 9.77e+37, -3.58e-39]]]], dtype=torch.bfloat16)[:, :, 1:3]
    c = torch.tensor([[[[-0.32], [3.34]], [[2.91], [-1.13]], [[-0.18], [-2.81]]]], dtype=torch.bfloat16)
    d = torch.tensor([[[[1.336, 1.22, 0.781]], [[1.875, 0.676, 2.3]], [[-2.17, -0.324, -2.88]]]], dtype=torch.bfloat16)
    return [a, b, c, d]


def call_5():  # resize
    a = torch.tensor([[[[-2.48, 2.38, -2.02]]]], dtype=torch.bfloat16).permute(2, 3, 0, 1)
    b = torch.tensor([[[[99.0], [-3.58e-39], [-2.55e+38], [1.64], [9.77e+37], [-3.58e-39], [1.156e+38]], [[99.0], [1.156e+38], [-2.55e+38], [-3.58e-39], [-1.38e-39], [-2.55e+38], [1.156e+38]], [[99.0], [-3.58e-39], [9.77e+37], [9.77e+37], [1.156e+38], [9.77e+37], [1.64]]]], dtype=torch.bfloat16)[:, :, 1:7]
    c = torch.tensor([[[[-2.81], [2.91], [3.34], [2.91], [-1.13], [-0.32]], [[-1.13], [-2.81], [-0.32], [2.91], [-0.32], [-2.81]], [[-1.13], [2.91], [2.91], [-0.18], [-0.32], [2.91]]]], dtype=torch.bfloat16)
    d = torch.tensor([[[[-1.18]], [[-0.461]], [[1.22]]]], dtype=torch.bfloat16)
    return [a, b, c, d]


CALLS = [(call_0, False), (call_1, False), (call_2, False), (call_3, False), (call_4, False), (call_5, False)]

if __name__ == "__main__":
    import os, sys
    sys.path.insert(0, os.path.join(os.path.dirname(coil.__file__), os.pardir, "tools"))
    from fuzz_calls import replay
    replay(fn, CALLS, 'mark')
