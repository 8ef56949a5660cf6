"""The Triton kernel backend: KernelPlan -> kernel source -> TritonLauncher."""
from __future__ import annotations

from coil.codegen.backend import GeneratedKernel, KernelBackend, register_kernel_backend
from coil.codegen.triton.kernel import PRELUDE, TritonKernel


#: Outer reductions (loads contiguous along x) longer than this run looped.
OUTER_PERSISTENT_RNUMEL = 64


def stream_elem_bytes(plan) -> int:
    """Widest element size (bytes) of the buffers this kernel streams: inputs/outputs
    with as many elements as its iteration space (4 when there are none). The runtime
    sizes blocks by it: a bf16-only kernel needs twice the elements per thread."""
    full = plan.numel * plan.rnumel
    sizes = []
    for n in list(plan.input_names) + list(plan.output_names):
        b = plan.buffer(n)
        numel = 1
        for s in b.get_size():
            numel *= int(s)
        if numel >= full:
            sizes.append(b.get_dtype().itemsize)
    return max(sizes) if sizes else 4


def _indent(lines, n):
    return [" " * n + l for l in lines]


def kernel_source(plan, name: str) -> tuple[str, list[str]]:
    """(module source, argument buffer names) for ``plan``."""
    source, arg_names, _ = _kernel_source(plan, name)
    return source, arg_names


def _kernel_source(plan, name: str) -> tuple[str, list[str], TritonKernel]:
    k = TritonKernel(plan, name)
    for pn in plan.nodes:
        k.begin(pn)
        pn.run(k)
    arg_names = list(plan.input_names) + list(plan.output_names)
    params = [k.args[n] for n in arg_names]
    red = plan.rnumel > 1
    consts = ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if red else [])
    out = ["@triton.jit", f"def {name}({', '.join(params + consts)}):"]
    body = [f"xnumel = {plan.numel}"]
    pid = "tl.program_id(0).to(tl.int64)" if k.index_dtype == "tl.int64" else "tl.program_id(0)"
    body.append(f"xoffset = {pid} * XBLOCK")
    body.append("xindex = xoffset + tl.arange(0, XBLOCK)" + ("[:, None]" if red else ""))
    body.append("xmask = xindex < xnumel")
    if red:
        body.append(f"rnumel = {plan.rnumel}")
        body.append("rbase = tl.arange(0, RBLOCK)[None, :]")
    if plan.tiled:
        pid1 = "tl.program_id(1).to(tl.int64)" if k.index_dtype == "tl.int64" else "tl.program_id(1)"
        body += [f"rindex = {pid1} * RBLOCK + rbase", "rmask = rindex < rnumel"]
        body += k.body
    elif not k.looped:
        if red:
            body += ["rindex = rbase", "rmask = rindex < rnumel"]
        body += k.body
    else:
        for sec in k.sections:
            body += sec["pre"] + sec["init"]
            if sec["loop"]:
                # the trip count as a literal: Triton 3.6's interpreter cannot index a
                # local int variable in range() ("only 0-dimensional arrays ...")
                body.append(f"for roffset in range(0, {plan.rnumel}, RBLOCK):")
                body += _indent(["rindex = roffset + rbase", "rmask = rindex < rnumel"] + sec["loop"], 4)
            body += sec["post"]
    out += _indent(body, 4)
    header = ["import triton", "import triton.language as tl",
              "from coil.runtime.triton_libdevice import libdevice, red, rng", "", f"# {plan.describe()}"]
    if k.outer_reduction:
        # r walks rows of a row-major input: tiles are XBLOCK wide along memory
        header.append("# outer reduction: loads contiguous along x")
    return "\n".join(header + PRELUDE.split("\n") + ["", ""] + out) + "\n", arg_names, k


@register_kernel_backend("triton")
class TritonBackend(KernelBackend):
    """Triton kernels; on CPU tensors they run under the Triton interpreter."""

    name = "triton"

    def generate(self, plan, kernel_name: str) -> GeneratedKernel:
        from coil.runtime.triton_runtime import TritonLauncher
        source, arg_names, k = _kernel_source(plan, kernel_name)
        tiled = plan.tiled
        if k.outer_reduction and plan.persistent and plan.rnumel > OUTER_PERSISTENT_RNUMEL and not tiled:
            # x-contiguous reductions tile wide along x: a whole column per program would
            # not fit in registers, so loop over r in short steps instead
            plan.replan(OUTER_PERSISTENT_RNUMEL)
            source, arg_names, k = _kernel_source(plan, kernel_name)
        dev = plan.buffer(plan.nodes[0].name).get_device()
        launcher = TritonLauncher(kernel_name, source, plan.numel, plan.rnumel, plan.persistent,
                                  dev.type, outer=k.outer_reduction and not tiled,
                                  elem_bytes=stream_elem_bytes(plan), tiled=tiled)
        return GeneratedKernel(kernel_name, source, arg_names, launcher, "triton")
