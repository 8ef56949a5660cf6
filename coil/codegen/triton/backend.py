"""The Triton kernel backend: KernelPlan -> kernel source -> TritonLauncher."""
from __future__ import annotations

import math
from typing import Optional

import sympy
import torch

from coil.codegen.backend import GeneratedKernel, KernelBackend, register_kernel_backend
from coil.codegen.common import KernelPlan
from coil.codegen.triton.eviction import add_eviction_hints
from coil.codegen.triton.kernel import PRELUDE, TritonKernel
from coil.config import config
from coil.ir.symbols import hint, is_static


#: Outer reductions (loads contiguous along x) longer than this run looped.
OUTER_PERSISTENT_RNUMEL = 64


def stream_elem_bytes(plan) -> int:
    """Widest element size (bytes) of the buffers this kernel streams: inputs/outputs
    with as many elements as its iteration space (4 when there are none). The runtime
    sizes blocks by it: a bf16-only kernel needs twice the elements per thread."""
    full = hint(plan.numel * plan.rnumel)
    bufs = [plan.buffer(n) for n in list(plan.input_names) + list(plan.output_names)]
    return max((b.get_dtype().itemsize for b in bufs if math.prod(hint(s) for s in b.get_size()) >= full), default=4)


def size_params(plan) -> list[str]:
    """The integer parameters of a kernel with symbolic sizes: ``xnumel``, ``rnumel``
    (reductions) and the size symbols its indices use ([] for static sizes)."""
    if not (syms := plan.size_symbols()):
        return []
    return ["xnumel"] + (["rnumel"] if plan.rnumel != 1 else []) + [s.name for s in syms]


def size_values(plan) -> list:
    """The expressions the wrapper passes for :func:`size_params`, in order."""
    if not plan.size_symbols():
        return []
    return [plan.numel] + ([plan.rnumel] if plan.rnumel != 1 else []) + list(plan.size_symbols())


def _other_sizes(plan, sizes: list) -> list:
    """``sizes`` (the kernel's int arguments) at two other values of the size symbols: each hint plus one, and times 16,
    so the launcher can compile ahead the Triton specialization classes (divisibility by 16) later sizes may fall in."""
    syms = plan.size_symbols()
    try:
        return [[int(sympy.sympify(e).subs({s: f(hint(s)) for s in syms})) for e in sizes]
                for f in (lambda h: h + 1, lambda h: 16 * h)]
    except (TypeError, ValueError):  # an expression the substitution leaves symbolic
        return []


def _indent(lines, n):
    return [" " * n + l for l in lines]


def _plan_gpu(plan) -> bool:
    """Whether ``plan`` runs on a GPU (else Triton's interpreter) per the launcher: its first node's buffer's device."""
    return plan.buffer(plan.nodes[0].name).get_device().type != "cpu" or config.triton_check_configs


def launch_args(plan, gpu: bool, outer: bool) -> dict:
    """The keyword arguments of :func:`coil.runtime.triton_runtime.launch_configs` (and of :class:`TritonLauncher`) for
    ``plan``: one place, so that the mask decision and the launcher see the same candidate configs."""
    return dict(numel=hint(plan.numel), rnumel=hint(plan.rnumel), persistent=plan.persistent, gpu=gpu,
                outer=outer and not plan.tiled, elem_bytes=stream_elem_bytes(plan), tiled=plan.tiled)


def mask_exactness(plan, gpu: bool, outer: bool = False) -> tuple[bool, bool]:
    """``(x exact, r exact)`` for ``plan``: whether ``xmask`` / ``rmask`` are all true for every launch config
    the runtime may choose (every XBLOCK divides numel, every RBLOCK divides rnumel); such masks are left out
    of loads, stores and reduction guards."""
    from coil.runtime.triton_runtime import blocks_divide, launch_configs
    if plan.symbolic:
        return False, False  # (symbolic: any size may come, every mask stays)
    return blocks_divide(launch_configs(**launch_args(plan, gpu, outer)), plan.numel, plan.rnumel)


def kernel_source(plan, name: str, gpu: Optional[bool] = None) -> tuple[str, list[str], TritonKernel]:
    """(module source, argument buffer names, the kernel) for ``plan``; ``gpu`` overrides
    the device the masks are decided for (default: the plan's)."""
    gpu = _plan_gpu(plan) if gpu is None else gpu
    exact = mask_exactness(plan, gpu)
    if (k := _run_kernel(plan, name, exact)).outer_reduction and mask_exactness(plan, gpu, True) != exact:
        # the outer-reduction candidates differ; it is known only after generating
        # (from the loads' strides, which do not depend on the masks)
        exact = mask_exactness(plan, gpu, True)
        k = _run_kernel(plan, name, exact)
    if k.looped and not is_static(plan.rnumel) and not k.outer_reduction:
        # a symbolic row length: a persistent twin too, under ``if PERSISTENT:``, which the launcher
        # sets for size buckets of short rows (softmax over 1000 of 65536 rows: 1.8x faster on an H200)
        twin = KernelPlan(plan.group, plan.graph, plan.live_after, tiled=plan.tiled, persistent=True,
                          dead_inputs=plan.dead_inputs)
        k.twin = _run_kernel(twin, name, exact, k.args)
    return _module_source(plan, name, k, exact)


def _run_kernel(plan, name: str, exact: tuple[bool, bool], args: Optional[dict] = None) -> TritonKernel:
    k = TritonKernel(plan, name, x_exact=exact[0], r_exact=exact[1])
    if args is not None:  # a persistent twin: the looped kernel's parameters (it stores fewer)
        k.args = {n: args[n] for n in k.args}
    for pn in plan.nodes:
        k.begin(pn)
        pn.run(k)
    return k


def _module_source(plan, name: str, k: TritonKernel, exact) -> tuple[str, list[str], TritonKernel]:
    arg_names = list(plan.input_names) + plan.arg_output_names
    params = [k.args[n] for n in arg_names]
    red = plan.rnumel != 1
    consts = ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if red else []) + (
        ["PERSISTENT: tl.constexpr"] if k.twin else [])
    if sizes := size_params(plan):
        # symbolic sizes: kernel arguments. Triton specializes xnumel and rnumel on divisibility by 16
        # (vectorized masked loads/stores): a binary per class of them a launch config meets, never one per
        # size (runtime/triton_dynamic.py); not the symbols, whose products with constants carry the alignment
        # that matters (a new class of a sequence length compiled every kernel again)
        syms = [n for n in sizes if n not in ("xnumel", "rnumel")]
        out = [f"@triton.jit(do_not_specialize={syms!r})" if syms else "@triton.jit",
               f"def {name}({', '.join(params + sizes + consts)}):"]
        body = []
    else:
        out = ["@triton.jit", f"def {name}({', '.join(params + consts)}):"]
        body = [f"xnumel = {plan.numel}"]
    pid = "tl.program_id(0).to(tl.int64)" if k.index_dtype == "tl.int64" else "tl.program_id(0)"
    body += [f"xoffset = {pid} * XBLOCK", "xindex = xoffset + tl.arange(0, XBLOCK)" + ("[:, None]" if red else "")]
    # a mask that is all true for every launch config is not computed (mask_exactness)
    xmask = [] if exact[0] else ["xmask = xindex < xnumel"]
    rmask = [] if exact[1] else ["rmask = rindex < rnumel"]
    body += xmask
    if red:
        if not sizes:
            body.append(f"rnumel = {plan.rnumel}")
        body.append("rbase = tl.arange(0, RBLOCK)[None, :]")
    if plan.tiled:
        pid1 = "tl.program_id(1).to(tl.int64)" if k.index_dtype == "tl.int64" else "tl.program_id(1)"
        body += [f"rindex = {pid1} * RBLOCK + rbase"] + rmask
        body += k.body
    elif not k.looped:
        if red:
            body += ["rindex = rbase"] + rmask
        body += k.body
    else:
        loops, looped = add_eviction_hints([sec["loop"] for sec in k.sections]), []
        for sec, loop in zip(k.sections, loops):
            looped += sec["pre"] + sec["init"]
            if loop:
                # the trip count as a literal: Triton 3.6's interpreter cannot index a
                # local int variable in range() ("only 0-dimensional arrays ...")
                looped.append(f"for roffset in range(0, {'rnumel' if sizes else plan.rnumel}, RBLOCK):")
                looped += _indent(["rindex = roffset + rbase"] + rmask + loop, 4)
            looped += sec["post"]
        body += ["if PERSISTENT:", *_indent(["rindex = rbase"] + rmask + k.twin.body, 4), "else:",
                 *_indent(looped, 4)] if k.twin else looped
    out += _indent(body, 4)
    header = ["import triton", "import triton.language as tl",
              "from coil.runtime.triton_libdevice import libdevice, red, rng", "", f"# {plan.describe()}"
              + (" (and persistent: PERSISTENT)" if k.twin else "")]
    if k.outer_reduction:
        # r walks rows of a row-major input: tiles are XBLOCK wide along memory
        header.append("# outer reduction: loads contiguous along x")
    word = lambda e: "exact" if e else "masked"
    header.append(f"# masks: x {word(exact[0])}" + (f", r {word(exact[1])}" if red else ""))
    return "\n".join(header + PRELUDE.split("\n") + ["", ""] + out) + "\n", arg_names, k


@register_kernel_backend("triton")
class TritonBackend(KernelBackend):
    """Triton kernels; on CPU tensors they run under the Triton interpreter."""

    name = "triton"
    # tl.atomic_add rejects bool and 8/16-bit ints; the interpreter has no bf16 atomics
    atomic_add_dtypes = frozenset({torch.float16, torch.float32, torch.float64, torch.int32, torch.int64})

    @property
    def persistent_rnumel(self) -> int:
        return config.triton_persistent_rnumel

    def generate(self, plan, kernel_name: str) -> GeneratedKernel:
        from coil.runtime.triton_runtime import TritonLauncher, blocks_divide
        source, arg_names, k = kernel_source(plan, kernel_name)
        if k.outer_reduction and plan.persistent and hint(plan.rnumel) > OUTER_PERSISTENT_RNUMEL and not plan.tiled:
            # x-contiguous reductions tile wide along x: a whole column per program would
            # not fit in registers, so loop over r in short steps instead
            plan.replan(OUTER_PERSISTENT_RNUMEL)
            source, arg_names, k = kernel_source(plan, kernel_name)
        dev = plan.buffer(plan.nodes[0].name).get_device()
        a = launch_args(plan, _plan_gpu(plan), k.outer_reduction)
        dtypes = [plan.buffer(n).get_dtype() for n in arg_names]
        if plan.symbolic:
            from coil.runtime.triton_dynamic import DynamicTritonLauncher
            sizes = size_values(plan)
            # a symbolic row of one element at the hint is still a row (RBLOCK, rnumel)
            r = a["rnumel"] if is_static(plan.rnumel) else max(a["rnumel"], 2)
            launcher = DynamicTritonLauncher(kernel_name, source, a["numel"], r, len(arg_names), dev.type,
                                             outer=a["outer"], elem_bytes=a["elem_bytes"], tiled=a["tiled"],
                                             arg_dtypes=dtypes, size_hints=[hint(e) for e in sizes],
                                             other_sizes=_other_sizes(plan, sizes) if dev.type != "cpu" else (),
                                             twin=k.twin is not None, persistent=bool(a["persistent"]))
            launcher.written = _written_args(plan, arg_names)
            return GeneratedKernel(kernel_name, source, arg_names, launcher, "triton", size_args=sizes)
        launcher = TritonLauncher(kernel_name, source, a["numel"], a["rnumel"], a["persistent"], dev.type,
                                  outer=a["outer"], elem_bytes=a["elem_bytes"], tiled=a["tiled"], arg_dtypes=dtypes)
        ok = blocks_divide(launcher.configs, plan.numel, plan.rnumel)
        if (k.x_exact and not ok[0]) or (k.r_exact and not ok[1]):
            raise AssertionError(f"{kernel_name}: masks dropped for configs the launcher "
                                 f"does not use ({launcher.configs})")
        launcher.written = _written_args(plan, arg_names)
        return GeneratedKernel(kernel_name, source, arg_names, launcher, "triton")


def _written_args(plan, arg_names: list) -> frozenset:
    """Positions in ``arg_names`` of the arguments the kernel stores to: its outputs, and the inputs an output is
    stored over (``plan.inplace``). Autotuning copies only these (runtime/triton_runtime.py: scratch_copies)."""
    written = set(plan.arg_output_names) | set(plan.inplace.values())
    return frozenset(i for i, n in enumerate(arg_names) if n in written)
