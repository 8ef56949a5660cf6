"""Corpus: torch functions, nn.functional, Tensor methods, attributes and operators.

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import math

import pytest
import torch
import torch.nn.functional as F

from corpus_harness import C, cases, rand_pos, randint, randn


def x34():
    return (randn(3, 4),)


def x34_y34():
    return randn(3, 4), randn(3, 4)


def add_mul(x, y):
    return x + y * 2 - x / 3


def torch_funcs(x, y):
    return torch.sin(x) + torch.cos(y) + torch.exp(torch.tanh(x)) * torch.sigmoid(y)


def log_sqrt(x):
    return torch.log(x) + torch.sqrt(x) + torch.rsqrt(x) + x.reciprocal()


def pow_ops(x, y):
    return x ** 2 + torch.pow(y, 3) + 2 ** x.clamp(-2, 2)


def reductions(x):
    return x.sum(), x.mean(dim=1), x.amax(0), x.std(1), x.var(), x.prod(1), x.norm()


def reductions_keepdim(x):
    return x.sum(-1, keepdim=True) - x.mean(0, keepdim=True) + x.logsumexp(1, keepdim=True)


def argmax_min(x):
    return x.argmax(1), x.argmin(), torch.max(x, dim=0).values, torch.min(x, 1)[1]


def cumulative(x):
    return x.cumsum(1), x.cumprod(0), torch.cummax(x, 1).values


def matmuls(x):
    w = x.t()
    return x @ w, torch.mm(x, w), torch.matmul(w, x), x.mm(w).relu()


def bmm_einsum(a, b):
    return torch.bmm(a, b), torch.einsum("bij,bjk->bik", a, b)


def views(x):
    return x.view(4, 3), x.reshape(-1), x.flatten(), x.unsqueeze(0).squeeze(0), x.t().contiguous()


def permute_transpose(x):
    return x.permute(2, 0, 1), x.transpose(0, 1), x.movedim(0, -1), x.unflatten(2, (2, 2))


def cat_stack(x, y):
    return torch.cat([x, y], 0), torch.stack((x, y), dim=1), torch.hstack([x, y]), torch.vstack([x, y])


def split_chunk(x):
    a, b = x.chunk(2, dim=1)
    c, d, e = torch.split(x, [1, 1, 2], dim=1)
    return a * b, c + d - e, x.unbind(0)[1]


def where_clamp(x, y):
    return torch.where(x > y, x, y), x.clamp(min=-0.5, max=0.5), torch.clamp_min(y, 0.1), x.abs().sign()


def comparisons(x, y):
    return x > y, x <= 0.3, x == x, torch.ne(x, y), (x > 0) & (y < 0), (x > 0) | ~(y > 0), (x > 0) ^ (y > 0)


def dtype_convert(x):
    return x.double(), x.half(), x.to(torch.int32), x.long(), x.bool(), x.type(torch.float64), x.to(dtype=torch.bfloat16)


def type_promotion(x, i):
    return x + i, i * 2.5, i // 2, i / 3, x * True, i + 1


def int_ops(i, j):
    return i % 3, i & j, i | j, i ^ j, i << 1, j >> 1, torch.bitwise_not(i), i // j.clamp(min=1)


def creation(x):
    return (torch.zeros(x.shape) + x, torch.ones_like(x) * x, torch.full((3, 4), 2.5) - x,
            torch.arange(12, dtype=torch.float32).view(3, 4) + x, torch.eye(4) @ x.t().t().T,
            torch.empty_like(x).fill_(1.5) * x, torch.linspace(0, 1, 4) * x, torch.zeros_like(x, dtype=torch.int64))


def tensor_from_python(x):
    return x + torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor(3) * x, torch.as_tensor([[2.0]]) * x


def attributes(x):
    return (x.shape, x.size(), x.size(1), x.dim(), x.ndim, x.dtype, x.device, x.numel(),
            x.is_contiguous(), x.requires_grad, x.is_floating_point(), x.element_size(), x.T.shape, x.mT.shape,
            x.stride(), x.is_leaf, x.layout)


def attr_arith(x):
    n, m = x.shape
    return x.reshape(n * m) * (n + m), x.new_zeros(m, n) + x.shape[0], x.view(x.size(0), -1).sum(1) / x.size(-1)


def T_mT(x):
    return x.T + 1, x.mT * 2, x.transpose(-1, -2).T


def inplace_ops(x):
    y = x.clone()
    y.add_(1).mul_(2)
    y.sub_(x).div_(3)
    y.clamp_(-1, 1)
    y.relu_()
    return y


def inplace_on_input(x, y):
    x.add_(y)
    y.mul_(0.5)
    return x + y


def inplace_operators(x, y):
    z = x.clone()
    z += y
    z *= 2
    z -= 1
    z /= 3
    return z


def augassign_rebinds(x, y):
    x = x + 1
    x += y
    return x


def functional_activations(x):
    return (F.relu(x), F.gelu(x), F.silu(x), F.leaky_relu(x, 0.1), F.elu(x), F.softplus(x), F.hardtanh(x),
            F.mish(x), F.softmax(x, dim=-1), F.log_softmax(x, 1), F.tanh(x), F.hardswish(x))


def functional_linear(x, w, b):
    return F.linear(x, w, b), F.linear(x, w)


def functional_norms(x):
    return F.layer_norm(x, (4,)), F.normalize(x, dim=1), F.group_norm(x.view(3, 4, 1), 2), F.rms_norm(x, (4,))


def functional_conv(x, w):
    return F.conv2d(x, w, padding=1), F.max_pool2d(x, 2), F.avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, 1)


def functional_losses(x, y, t):
    return F.mse_loss(x, y), F.l1_loss(x, y), F.cross_entropy(x, t), F.nll_loss(F.log_softmax(x, 1), t), F.smooth_l1_loss(x, y)


def functional_misc(x):
    return F.pad(x, (1, 2)), F.one_hot(x.argmax(1), 4), F.interpolate(x.view(1, 3, 4), scale_factor=2), F.dropout(x, 0.5, training=False)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)


def tensor_methods_misc(x):
    return x.exp().log1p(), x.expm1(), x.floor(), x.ceil(), x.round(), x.trunc(), x.frac(), x.neg(), x.square(), x.erf()


def sort_topk(x):
    v, i = x.sort(1)
    return v, i, x.topk(2, dim=1).values, torch.argsort(x, 0), x.kthvalue(2, 1).values


def repeat_expand(x):
    return x.repeat(2, 1), x[:, :1].expand(3, 4), x.expand_as(x), x.repeat_interleave(2, dim=0), x.tile((1, 2))


def flip_roll(x):
    return x.flip(0), torch.roll(x, 1, 1), x.tril(), x.triu(1), torch.rot90(x)


def gather_scatter(x, idx):
    return x.gather(1, idx), torch.zeros(3, 4).scatter(1, idx, x), x.scatter_add(1, idx, x), torch.take_along_dim(x, idx, 1)


def masked(x):
    return x.masked_fill(x > 0, -1.0), torch.where(x < 0, 0.0, x), x * (x > 0)


def outer_cross(a, b):
    return torch.outer(a, b), a.dot(b), torch.cross(a[:3].view(1, 3), b[:3].view(1, 3), dim=1), torch.kron(a[:2], b[:2])


def linalg(x):
    s = x @ x.T + torch.eye(3) * 3
    return torch.linalg.inv(s), torch.linalg.norm(x), torch.det(s), torch.linalg.cholesky(s), torch.trace(s)


def complex_dtypes(x):
    return x.float().sum(), x.int().sum(), (x * 2).to(torch.float16), x.to(torch.float64) * 1e-3


def nan_inf(x):
    y = x / 0.0
    return torch.isnan(y), torch.isinf(y), torch.nan_to_num(y), torch.isfinite(x)


def mixed_scalars(x):
    return x * math.pi + math.e, x / 7, 3 - x, 1 / x.abs().clamp(min=0.1), -x, +x


def bool_tensor(x):
    m = x > 0
    return m.any(), m.all(), m.sum(), m.float().mean(), torch.logical_and(m, ~m), m.int() * 3


def int_tensor(i):
    return i.sum(), i.max(), i.float().mean(), i * 2


def chained_methods(x):
    return x.abs().add(1).log().mul(2).sub(0.5).div(3).pow(2).sqrt().sum(dim=0).softmax(0)


def matmul_broadcast(x, y):
    return x @ y, (x.unsqueeze(-1) * y.unsqueeze(0)).sum(1), torch.baddbmm(torch.zeros(2, 3, 5), x.expand(2, 3, 4), y.expand(2, 4, 5))


def lerp_addcmul(x, y):
    return torch.lerp(x, y, 0.3), torch.addcmul(x, x, y, value=0.5), torch.addcdiv(x, x, y.abs() + 1), x.hypot(y), torch.atan2(x, y)


def clone_detach(x):
    y = x.clone()
    z = x.detach()
    return y * 2, z + 1, x.contiguous(), x.data * 3


def requires_grad_ops(x, w):
    return (x @ w).tanh().sum(1), w.requires_grad, x.requires_grad


def to_same(x):
    return x.to(torch.float32), x.to("cpu"), x.cpu(), x.type_as(x), x.float()


def torch_constants(x):
    return x.clamp(max=torch.finfo(torch.float32).max), x * torch.iinfo(torch.int8).max, x.new_tensor(2.0) + x


def tensor_bool_ops(x):
    return torch.isclose(x, x + 1e-9), x.eq(x).all(), x.sign()


CASES = cases(
    C(add_mul, x34_y34),
    C(torch_funcs, x34_y34),
    C(log_sqrt, lambda: (rand_pos(3, 4),)),
    C(pow_ops, x34_y34),
    C(reductions, x34),
    C(reductions_keepdim, x34),
    C(argmax_min, x34),
    C(cumulative, x34),
    C(matmuls, x34),
    C(bmm_einsum, lambda: (randn(2, 3, 4), randn(2, 4, 5))),
    C(views, x34),
    C(permute_transpose, lambda: (randn(2, 3, 4),)),
    C(cat_stack, x34_y34),
    C(split_chunk, x34),
    C(where_clamp, x34_y34),
    C(comparisons, x34_y34),
    C(dtype_convert, x34),
    C(type_promotion, lambda: (randn(3, 4), randint(-5, 5, 3, 4))),
    C(int_ops, lambda: (randint(0, 50, 3, 4), randint(0, 50, 3, 4))),
    C(creation, x34),
    C(tensor_from_python, x34),
    C(attributes, x34),
    C(attr_arith, x34),
    C(T_mT, x34),
    C(inplace_ops, x34),
    C(inplace_on_input, x34_y34),
    C(inplace_operators, x34_y34),
    C(augassign_rebinds, x34_y34),
    C(functional_activations, x34),
    C(functional_linear, lambda: (randn(3, 4), randn(5, 4), randn(5))),
    C(functional_norms, x34),
    C(functional_conv, lambda: (randn(1, 2, 6, 6), randn(3, 2, 3, 3))),
    C(functional_losses, lambda: (randn(3, 4), randn(3, 4), randint(0, 4, 3))),
    C(functional_misc, x34),
    C(sdpa, lambda: (randn(1, 2, 5, 8), randn(1, 2, 5, 8), randn(1, 2, 5, 8))),
    C(tensor_methods_misc, x34),
    C(sort_topk, x34),
    C(repeat_expand, x34),
    C(flip_roll, lambda: (randn(4, 4),)),
    C(gather_scatter, lambda: (randn(3, 4), randint(0, 4, 3, 4))),
    C(masked, x34),
    C(outer_cross, lambda: (randn(5), randn(5))),
    C(linalg, x34),
    C(complex_dtypes, x34),
    C(nan_inf, x34),
    C(mixed_scalars, x34),
    C(bool_tensor, x34),
    C(int_tensor, lambda: (randint(0, 10, 12),)),
    C(chained_methods, x34),
    C(matmul_broadcast, lambda: (randn(3, 4), randn(4, 5))),
    C(lerp_addcmul, x34_y34),
    C(clone_detach, x34),
    C(requires_grad_ops, lambda: (randn(3, 4), randn(4, 2, requires_grad=True)), backward=True),
    C(to_same, x34),
    C(torch_constants, x34),
    C(tensor_bool_ops, x34),
)


@pytest.mark.parametrize("case", CASES)
def test_tensors(case, check):
    check(case)
