"""2-D tiled pointwise kernels (codegen/tiling.py): a kernel whose accesses are
contiguous along different dims (a transpose) runs as [XBLOCK, RBLOCK] tiles on a 2-D
grid, so Triton can coalesce both sides."""
import pytest
import torch

from codegen_helpers import check


def _kinds(c):
    return [k.name.split("_")[1] for k in c.kernels]


@pytest.mark.parametrize("shape", [(96, 64), (33, 517), (1000, 24)])
def test_transpose_plus_add_is_one_tiled_kernel(shape):
    def f(x, y):
        return (x.t() * 2).contiguous() + y

    x, y = torch.randn(*shape), torch.randn(shape[1], shape[0])
    c = check(f, x, y, kernels=1)
    assert _kinds(c) == ["til"], [k.name for k in c.kernels]
    src = c.kernels[0].source
    assert "tl.program_id(1) * RBLOCK" in src and "for roffset" not in src, src


def test_nchw_to_nhwc_copy_is_tiled():
    def f(x):
        return x.permute(0, 2, 3, 1).contiguous() * 2

    c = check(f, torch.randn(2, 16, 9, 11), kernels=1)
    assert _kinds(c) == ["til"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_transpose_low_precision(dtype):
    def f(x):
        return torch.sigmoid(x.t()).contiguous()

    check(f, torch.randn(40, 72).to(dtype), kernels=1, atol=1e-2, rtol=1e-2)


def test_contiguous_pointwise_stays_flat():
    c = check(lambda x, y: x * y + 1, torch.randn(64, 48), torch.randn(64, 48), kernels=1)
    assert _kinds(c) == ["poi"]


def test_tiled_configs():
    from coil.runtime.triton_runtime import tiled_configs
    for y, x in [(3072, 4096), (64, 8), (10, 1000)]:
        cfgs = tiled_configs(y, x, gpu=True)
        assert 1 <= len(cfgs) <= 4
        for c in cfgs:
            assert c["XBLOCK"] <= max(16, 1 << (y - 1).bit_length())
            assert c["RBLOCK"] <= max(16, 1 << (x - 1).bit_length())
            assert c["XBLOCK"] * c["RBLOCK"] // max(c["num_warps"], 1) >= 32
    assert len(tiled_configs(3072, 4096, gpu=False)) == 1


def test_scatter_of_transposed_values_is_not_tiled():
    def f(x, idx, v):
        return torch.index_put(x, (idx,), v.t(), accumulate=True)

    x, v = torch.randn(50, 64), torch.randn(64, 40)
    idx = torch.randint(0, 50, (40,))
    c = check(f, x, idx, v, atol=1e-4, rtol=1e-4)
    assert "til" not in _kinds(c), [k.name for k in c.kernels]


# ---------------------------------------------------------------- dynamic shapes
def _tiles_and_graphs(fn, make, sizes, dims, monkeypatch, tmp_path, dynamic=True):
    """Run ``coil.compile(fn)`` (Triton backend) on ``make(n)`` for every ``n``, with
    ``dims`` of the first argument marked dynamic (none with ``dynamic`` False), comparing
    values and strides with eager; returns (compiled graphs, tile_2d groups logged)."""
    import json
    import os

    import coil
    import coil.codegen
    from coil import trace
    from coil.config import patch

    graphs, orig = [], coil.codegen.compile_aten_graph
    monkeypatch.setattr(coil.codegen, "compile_aten_graph",
                        lambda gm, ex, d: graphs.append(orig(gm, ex, d)) or graphs[-1])
    f = coil.compile(fn, dynamic=False if not dynamic else None)
    trace.set_dir(str(tmp_path))
    try:
        with patch(cpu_backend="triton"):
            for n in sizes:
                args = make(n)
                for d in dims if dynamic else ():
                    coil.mark_dynamic(args[0], d)
                got, exp = f(*args), fn(*args)
                torch.testing.assert_close(got, exp)
                assert got.stride() == exp.stride()
    finally:
        trace.set_dir(None)
    recs = [json.loads(l) for p in os.listdir(tmp_path) for l in open(os.path.join(tmp_path, p))]
    return graphs, [r["group"] for r in recs if r.get("event") == "tile_2d"]


DYNAMIC_CASES = {
    # dynamic rows: out (48, n), X = n symbolic, Y = 48
    "transpose_rows": (lambda x: x.transpose(0, 1).contiguous(), lambda n: (torch.randn(n, 48),), [0]),
    # dynamic columns: out (n, 40), Y = n symbolic, X = 40
    "transpose_cols": (lambda x: x.transpose(0, 1).contiguous() * 2, lambda n: (torch.randn(40, n),), [1]),
    # NCHW -> NHWC with a dynamic batch: Y = n * 99 symbolic, X = 16
    "nchw_to_nhwc": (lambda x: x.permute(0, 2, 3, 1).contiguous() + 1,
                     lambda n: (torch.randn(n, 16, 9, 11),), [0]),
}


@pytest.mark.parametrize("case", sorted(DYNAMIC_CASES))
def test_dynamic_transposes_are_one_tiled_kernel_for_every_size(case, monkeypatch, tmp_path):
    fn, make, dims = DYNAMIC_CASES[case]
    graphs, tiles = _tiles_and_graphs(fn, make, [2, 3, 17, 64], dims, monkeypatch, tmp_path)
    assert len(graphs) == 1 and _kinds(graphs[0]) == ["til"], [g.source for g in graphs]
    src = graphs[0].kernels[0].source
    assert "xnumel, rnumel" in src and "tl.program_id(1) * RBLOCK" in src and "rmask" in src, src
    assert len(tiles) == 1


@pytest.mark.parametrize("case", sorted(DYNAMIC_CASES))
def test_dynamic_graph_tiles_the_groups_the_static_one_tiles(case, monkeypatch, tmp_path):
    fn, make, dims = DYNAMIC_CASES[case]
    _, static = _tiles_and_graphs(fn, make, [24], dims, monkeypatch, tmp_path / "s", dynamic=False)
    _, dynamic = _tiles_and_graphs(fn, make, [24], dims, monkeypatch, tmp_path / "d")
    assert static and dynamic == static


def test_padded_logits_copy_matches_static_and_specializes_xnumel(monkeypatch, tmp_path):
    # GPT-2's slowest dynamic kernel: the LM head's logits, (B*L, V) out of a matmul
    # output with rows padded to a multiple of 8 (V = 50257 there). Flat in the static
    # and the dynamic graph (both sides walk rows contiguously); the dynamic kernel lets
    # Triton specialize xnumel on divisibility by 16 (masks of a constant stride then
    # allow vector stores; unspecialized, every bf16 store was 2 bytes: 2.5x the static
    # kernel's time on an H200)
    fn = lambda p: p[:, :257].contiguous()
    make = lambda n: (torch.randn(n, 264).to(torch.bfloat16),)
    sgraphs, static = _tiles_and_graphs(fn, make, [6], [0], monkeypatch, tmp_path / "s", dynamic=False)
    graphs, dynamic = _tiles_and_graphs(fn, make, [2, 3, 17], [0], monkeypatch, tmp_path / "d")
    assert static == dynamic == [] and _kinds(graphs[-1]) == _kinds(sgraphs[-1]) == ["poi"]
    src = graphs[-1].kernels[0].source
    assert "xnumel," in src and "'xnumel'" not in src, src  # specialized; the symbols not


_PTX_STORES = r'''
import json, re, sys, tempfile, importlib.util
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
src, name, n_ptrs = json.loads(sys.stdin.read())
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(src)
spec = importlib.util.spec_from_file_location("k", f.name)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
fn, out = getattr(mod, name), []
for xnumel_16 in (False, True):  # Triton's specialization of a launch's xnumel
    sig = {a: "*bf16" if i < n_ptrs else "i32" for i, a in enumerate(fn.arg_names) if a != "XBLOCK"}
    sig["XBLOCK"] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(n_ptrs + xnumel_16)}
    c = triton.compile(ASTSource(fn, sig, {"XBLOCK": 1024}, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    out.append(sorted(set(re.findall(r"st\.global[.\w]*", c.asm["ptx"]))))
print(json.dumps(out))
'''


def test_dynamic_logits_copy_stores_vectors_when_xnumel_is_a_multiple_of_16(monkeypatch, tmp_path):
    # the sm_90 PTX of the dynamic kernel: 2-byte stores unless Triton may specialize
    # xnumel (which it now does for every dynamic kernel), 16-byte stores with it
    import json
    import os
    import subprocess
    import sys
    from test_triton_offline_compile import _offline_available
    if not _offline_available():
        pytest.skip("Triton's CUDA back end (ptxas) is not installed")
    fn = lambda p: p[:, :257].contiguous()
    graphs, _ = _tiles_and_graphs(fn, lambda n: (torch.randn(n, 264).to(torch.bfloat16),), [3, 5], [0],
                                  monkeypatch, tmp_path)
    k = graphs[-1].kernels[0]
    proc = subprocess.run([sys.executable, "-c", _PTX_STORES], input=json.dumps([k.source, k.name, 2]),
                          capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="0"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [["st.global.b16"], ["st.global.v4.b32"]]
