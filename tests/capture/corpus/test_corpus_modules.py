"""Corpus: nn.Module programs — common layers, containers, parameters and buffers,
self.training branches, hooks registered before compile, attribute writes, backward.

Each row's ``fn`` is a zero-argument factory (``module=True``) so eager and compiled
each get their own identically initialised module; the module's state (parameters,
buffers such as BatchNorm running stats, plain attributes) is compared after the call.

PYTEST_DONT_REWRITE: the corpus programs must stay plain Python (no assertion rewriting).
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from corpus_harness import C, cases, randint, randn


def M(factory, inputs, graphs=1, breaks=0, **kw):
    """A module row: ``factory()`` builds the module (under the build seed)."""
    kw.setdefault("name", factory.__name__)
    return C(factory, inputs, graphs, breaks, module=True, **kw)


def x8():
    return (randn(2, 8),)


def linear():
    return nn.Linear(8, 4)


def linear_no_bias():
    return nn.Linear(8, 3, bias=False)


def conv1d():
    return nn.Conv1d(3, 4, 3, padding=1)


def conv2d():
    return nn.Conv2d(3, 5, 3, stride=2, padding=1)


def conv3d():
    return nn.Conv3d(2, 3, 2)


def conv_transpose2d():
    return nn.ConvTranspose2d(3, 2, 2, stride=2)


def batchnorm1d_eval():
    return nn.BatchNorm1d(8).eval()


def batchnorm2d_train():
    return nn.BatchNorm2d(3)


def batchnorm2d_eval():
    m = nn.BatchNorm2d(3)
    m.running_mean.uniform_(-1, 1)
    m.running_var.uniform_(0.5, 2)
    return m.eval()


def layernorm():
    return nn.LayerNorm(8)


def groupnorm():
    return nn.GroupNorm(2, 4)


def embedding():
    return nn.Embedding(10, 6)


class EmbSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 4, padding_idx=0)

    def forward(self, idx):
        return self.emb(idx).sum(1)


def embedding_bag_like():
    return EmbSum()


def dropout_eval():
    return nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).eval()


def activations():
    return nn.Sequential(nn.ReLU(), nn.GELU(), nn.SiLU(), nn.Tanh(), nn.LeakyReLU(0.2), nn.ELU(), nn.Softplus(),
                         nn.Hardswish(), nn.Sigmoid(), nn.Softmax(dim=-1))


def mha():
    return nn.MultiheadAttention(8, 2, batch_first=True).eval()


class MHASelf(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True, dropout=0.0)

    def forward(self, x):
        out, weights = self.attn(x, x, x, need_weights=True)
        return out, weights


def mha_train():
    return MHASelf()


def mha_input():
    return (randn(2, 5, 8),)


class MHAMasked(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


def mha_causal_mask():
    return MHAMasked().eval()


def sequential():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


class MLPList(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) + (x if i % 2 else 0)
        return self.layers[-1](x) * len(self.layers)


def module_list():
    return MLPList()


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 2), "b": nn.Linear(8, 3)})

    def forward(self, x):
        out = {k: h(x) for k, h in self.heads.items()}
        return out, self.heads["a"](x).sum() + len(self.heads), list(self.heads.keys())


def module_dict():
    return Heads()


class Indexed(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))

    def forward(self, x):
        return self.seq[0](x), self.seq[1:](x), self.seq[-1](self.seq[0](x))


def sequential_indexing():
    return Indexed()


class ParamsBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 4))
        self.register_buffer("scale", torch.rand(4) + 0.5)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.steps += 1
        return (x @ self.w) * self.scale + self.steps


def params_buffers():
    return ParamsBuffers()


class ParamIteration(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        reg = sum(p.pow(2).sum() for p in self.parameters())
        names = [n for n, _ in self.named_parameters()]
        return self.b(self.a(x)) + reg, names, len(list(self.children())), len(list(self.modules()))


def param_iteration():
    return ParamIteration()


class TrainingBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            return y * 2
        return y - 1


def training_branch_train():
    return TrainingBranch()


def training_branch_eval():
    return TrainingBranch().eval()


class AttrWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.calls = 0
        self.last_shape = None

    def forward(self, x):
        self.calls += 1
        self.last_shape = tuple(x.shape)
        self.cache = x.detach() * 2
        return self.lin(x)


def module_attr_write():
    return AttrWrite()


class HookedLinear(nn.Linear):
    pass


def _pre_hook(mod, args):
    return (args[0] * 2,)


def _post_hook(mod, args, out):
    return out + 1


def forward_hooks():
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    m[0].register_forward_pre_hook(_pre_hook)
    m[2].register_forward_hook(_post_hook)
    return m


class HookLog(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.seen = []
        self.lin.register_forward_hook(lambda mod, args, out: self.seen.append(out.shape[-1]))

    def forward(self, x):
        return self.lin(x).relu()


def hook_side_effect():
    return HookLog()


def hook_on_root():
    m = nn.Linear(8, 3)
    m.register_forward_hook(lambda mod, args, out: out * 0.5)
    m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    return m


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
        self.inner = TrainingBranch()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.inner(self.block(x)) + x)


def nested_modules():
    return Nested()


class SubclassForward(nn.Linear):
    def forward(self, x):
        return super().forward(x).sigmoid()


def linear_subclass():
    return SubclassForward(8, 5)


class KwargsForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, *, scale=1.0, residual=None):
        y = self.lin(x) * scale
        return y + residual if residual is not None else y


def kwargs_forward():
    return KwargsForward()


class SharedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.out = nn.Linear(8, 10, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, idx):
        return self.out(self.emb(idx))


def tied_weights():
    return SharedWeights()


class FunctionalCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 8))
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return F.gelu(F.linear(x, self.w, self.b)), self.w.shape, self.w.requires_grad


def functional_with_params():
    return FunctionalCalls()


class TransformerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.ln2 = nn.LayerNorm(8)
        self.mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def transformer_block_eval():
    return TransformerBlock().eval()


def transformer_encoder_layer():
    return nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)


def lstm_like_cell():
    return nn.GRUCell(8, 6)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.c1(x))))
        return self.fc(torch.flatten(x, 1))


def convnet_train():
    return ConvNet()


def convnet_eval():
    return ConvNet().eval()


def pooling_upsample():
    return nn.Sequential(nn.AvgPool2d(2), nn.Upsample(scale_factor=2, mode="nearest"), nn.AdaptiveMaxPool2d(3), nn.Flatten())


def identity_and_flatten():
    return nn.Sequential(nn.Identity(), nn.Flatten(0), nn.Unflatten(0, (2, 8)))


class ModuleCallsMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def helper(self, x, k):
        return self.lin(x) * k

    def forward(self, x):
        return self.helper(x, 2) + self.helper(x, 3)


def module_method_call():
    return ModuleCallsMethod()


class BufferInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("ema", torch.randn(8))

    def forward(self, x):
        self.ema.mul_(0.9).add_(x.mean(0) * 0.1)
        return x - self.ema


def buffer_inplace_update():
    return BufferInplace()


class ModuleAsInput(nn.Module):
    def forward(self, x, layer):
        return layer(x).relu()


class GradModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.n = nn.LayerNorm(8)

    def forward(self, x):
        return self.n(self.a(x).tanh()).sum(-1)


def backward_through_module():
    return GradModule()


def prelu_and_params():
    return nn.Sequential(nn.Linear(8, 8), nn.PReLU(), nn.Linear(8, 1))


CASES = cases(
    M(linear, x8),
    M(linear_no_bias, x8),
    M(conv1d, lambda: (randn(2, 3, 7),)),
    M(conv2d, lambda: (randn(1, 3, 8, 8),)),
    M(conv3d, lambda: (randn(1, 2, 3, 4, 4),)),
    M(conv_transpose2d, lambda: (randn(1, 3, 4, 4),)),
    M(batchnorm1d_eval, lambda: (randn(4, 8),)),
    M(batchnorm2d_train, lambda: (randn(4, 3, 5, 5),)),
    M(batchnorm2d_eval, lambda: (randn(2, 3, 4, 4),)),
    M(layernorm, lambda: (randn(3, 5, 8),)),
    M(groupnorm, lambda: (randn(2, 4, 6),)),
    M(embedding, lambda: (randint(0, 10, 2, 5),)),
    M(embedding_bag_like, lambda: (randint(0, 12, 3, 4),)),
    M(dropout_eval, x8),
    M(activations, x8),
    C(mha, lambda: (randn(2, 5, 8), randn(2, 5, 8), randn(2, 5, 8)), module=True, name="mha_eval"),
    M(mha_train, mha_input),
    M(mha_causal_mask, mha_input),
    M(sequential, x8),
    M(module_list, x8),
    M(module_dict, x8),
    M(sequential_indexing, x8),
    M(params_buffers, x8),
    M(param_iteration, x8),
    M(training_branch_train, x8),
    M(training_branch_eval, x8),
    M(module_attr_write, x8),
    M(forward_hooks, x8),
    M(hook_side_effect, x8),
    M(hook_on_root, x8),
    M(nested_modules, x8),
    M(linear_subclass, x8),
    M(kwargs_forward, lambda: __import__("corpus_harness").Args(randn(2, 8), scale=0.5, residual=randn(2, 8))),
    M(tied_weights, lambda: (randint(0, 10, 2, 3),)),
    M(functional_with_params, x8),
    M(transformer_block_eval, lambda: (randn(2, 5, 8),)),
    M(transformer_encoder_layer, lambda: (randn(2, 5, 8),)),
    M(lstm_like_cell, lambda: (randn(3, 8), randn(3, 6))),
    M(convnet_train, lambda: (randn(2, 3, 8, 8),)),
    M(convnet_eval, lambda: (randn(2, 3, 8, 8),)),
    M(pooling_upsample, lambda: (randn(1, 2, 6, 6),)),
    M(identity_and_flatten, x8),
    M(module_method_call, x8),
    M(buffer_inplace_update, lambda: (randn(4, 8),)),
    C(ModuleAsInput, lambda: (randn(2, 8), nn.Linear(8, 3)), module=True, name="module_as_argument"),
    M(backward_through_module, lambda: (randn(3, 8, requires_grad=True),), backward=True),
    M(prelu_and_params, x8, backward=True),
    M(convnet_train, lambda: (randn(2, 3, 8, 8),), backward=True, name="convnet_train_backward"),
)


@pytest.mark.parametrize("case", CASES)
def test_modules(case, check):
    check(case)
