"""Launch one generated Triton kernel (its source from a COIL_TRACE ``artifact`` or
``benchmarks/dump_failed_kernels.py``) under each launch config, synchronizing after
every launch, to tell a bad config from a bad kernel on the GPU machine. Each config runs
in its own process (an illegal memory access ends a CUDA context).

    CUDA_LAUNCH_BLOCKING=1 python benchmarks/gpu_kernel_replay.py KERNEL.py NAME NUMEL \\
        --arg 6272x384:bf16 ... --config 1,4096,8 --config 1,8192,16 [--drop-asserts]

``--arg`` gives each tensor argument in order (``SIZExSIZE:dtype``, contiguous, random);
``--config XBLOCK,RBLOCK,num_warps`` (RBLOCK 0: a pointwise kernel); the grid is
``ceil(NUMEL / XBLOCK)``. The HF Swin-T training reduction (BENCHMARKS.md, 2026-12-05):

    CUDA_LAUNCH_BLOCKING=1 python benchmarks/gpu_kernel_replay.py \
        benchmarks/results/kernels/hf_swin_train_red_6272.py triton_red_92_buf177 384 \
        --arg 6272x384:bf16 --arg 6272x384:bf16 --arg 6272x384:bf16 --arg 6272x384:f32 \
        --arg 6272:f32 --arg 6272:f32 --arg 384:f32 \
        --config 1,4096,8 --config 1,4096,16 --config 1,4096,32 --config 1,8192,16 [--drop-asserts]
"""
import argparse
import importlib.util
import subprocess
import sys

DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "i64": "int64", "i32": "int32"}


def _one(path, name, numel, args, cfg, drop_asserts) -> str:
    import torch

    src = open(path).read()
    if drop_asserts:
        src = "\n".join(line for line in src.splitlines() if "tl.device_assert" not in line)
    tmp = f"/tmp/_replay_{name}.py"
    open(tmp, "w").write(src)
    spec = importlib.util.spec_from_file_location("_replay", tmp)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tensors = []
    for a in args:
        shape, dt = a.split(":")
        dims = [int(d) for d in shape.split("x")]
        dev = "cuda" if torch.cuda.is_available() else "cpu"   # (TRITON_INTERPRET=1 on a CPU machine)
        tensors.append(torch.randn(dims, device=dev).to(getattr(torch, DTYPES[dt])))
    xb, rb, nw = cfg
    meta = dict(XBLOCK=xb, num_warps=nw) | (dict(RBLOCK=rb) if rb else {})
    getattr(mod, name)[(-(-numel // xb),)](*tensors, **meta)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return "ok"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("path"), p.add_argument("name"), p.add_argument("numel", type=int)
    p.add_argument("--arg", action="append", default=[])
    p.add_argument("--config", action="append", default=[])
    p.add_argument("--drop-asserts", action="store_true")
    p.add_argument("--child", default=None)
    a = p.parse_args()
    if a.child:
        print(_one(a.path, a.name, a.numel, a.arg, tuple(int(v) for v in a.child.split(",")), a.drop_asserts))
        return
    for cfg in a.config:
        cmd = [sys.executable, __file__, a.path, a.name, str(a.numel), "--child", cfg] + \
            [f"--arg={x}" for x in a.arg] + (["--drop-asserts"] if a.drop_asserts else [])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        out = (r.stdout.strip().splitlines() or [""])[-1] if r.returncode == 0 else \
            (r.stderr.strip().splitlines() or ["?"])[-1][:300]
        print(f"config {cfg}: {out}", flush=True)


if __name__ == "__main__":
    main()
