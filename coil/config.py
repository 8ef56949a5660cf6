"""One registry of coil's options (STYLE.md §9).

Every option is a typed, documented field of :class:`Config`. The defaults can be
overridden three ways, later ones winning:

1. environment variables ``COIL_<NAME>`` (read once at import: ``COIL_CPU_BACKEND=triton``),
2. assignment on the global object (``coil.config.config.cpu_backend = "triton"``, or
   ``coil.config.cpu_backend = "triton"``: the module forwards option names to it),
3. per compile, ``coil.compile(fn, options={"cpu_backend": "triton"})``, or in a block,
   ``with coil.config.patch(fallback_random=True): ...``.

Unknown option names, and values of the enumerated options (``cpu_backend``, ``partitioner``, ``dynamic``)
outside their values, raise ``ValueError`` listing the valid ones. The options in
force for a compilation are written to the compile log (event ``config``)."""
from __future__ import annotations

import os
import sys
import types
import warnings
from dataclasses import dataclass, fields
from typing import Any, Optional


@dataclass
class Config:
    """coil's options. Field docs are the user-facing documentation."""

    #: CPU code generator for the "coil" backend: "cpp" (C++/OpenMP kernels) or
    #: "triton" (Triton kernels run by the CPU interpreter; for tests).
    cpu_backend: str = "cpp"
    #: Call the ATen random ops instead of in-kernel RNG, so results equal eager bit for bit given the same seed.
    fallback_random: bool = False
    #: Recompiles of one code object after which it runs eagerly from then on.
    recompile_limit: int = 8
    #: Skip the guards whose inputs did not change since the last call, by dict version
    #: tags (coil/capture/guard_versions.py; Python 3.11 and 3.12).
    guard_versions: bool = True
    #: Autotune Triton kernels over block sizes on first launch (GPU only).
    autotune: bool = True
    #: Kernels iterating fewer elements than this are not autotuned: they take their first (heuristic) config
    #: (launch-bound kernels, where tuning gained about 1 us: docs/codegen.md).
    autotune_min_elements: int = 16384
    #: Threads compiling a kernel's candidate autotuning configs in parallel before they
    #: are timed (GPU only; 1 or 0: compile each config when it is first timed).
    autotune_compile_threads: int = 8
    #: Worker processes that compile every Triton kernel's launch configs as soon as code generation creates it, into
    #: Triton's disk cache (runtime/compile_pool.py; GPU only). Negative: half the CPU cores, at most 8; 0: off.
    autotune_compile_processes: int = -1
    #: Seconds a launcher waits for its configs that a worker process is compiling before it compiles them itself.
    autotune_compile_timeout: float = 120.0
    #: Seconds without compile jobs after which the worker processes exit (each holds a
    #: CUDA context, about 0.5 GB of GPU memory); the next compile starts them again.
    autotune_compile_idle_s: float = 30.0
    #: Triton: fuse softmax's sum(exp(x - max)) into the max loop of looped reductions
    #: (running max and rescaled running sum; one read of x fewer).
    triton_online_softmax: bool = True
    #: Testing: under Triton's CPU interpreter, decide masks and launch configs as for a GPU and run every candidate
    #: config at a kernel's first launch (per size bucket) on scratch copies, raising when one's values differ from
    #: the first's: a config the GPU may pick by timing that computes wrong values (a persistent reduction run with a
    #: looped kernel's RBLOCK) shows on the CPU (docs/testing.md).
    triton_check_configs: bool = False
    #: Triton: reductions of at most this many elements per output run persistent (one block holds the whole
    #: row); longer ones loop over the row (2048 after an H200 A/B, docs/codegen.md).
    triton_persistent_rnumel: int = 2048
    #: Streaming multiprocessors the CUDA split-reduction rule plans for: a reduction over the innermost dims
    #: with at least this many output rows is not split into partial reductions (``_split_decision`` in
    #: ir/lowering.py, docs/codegen.md). 0: the device's own count (``torch.cuda.get_device_properties``), or
    #: 132 (an H200) when no CUDA device can be asked.
    gpu_sm_count: int = 0
    #: Use the min-cut partitioner for training graphs ("min_cut") or save what the backward reads ("default").
    partitioner: str = "min_cut"
    #: AOT min-cut partitioner: a reduction is recomputed in the backward (instead of
    #: saved) only if its input has at most this many elements.
    aot_max_recompute_reduction: int = 4096
    #: Directory of the on-disk kernel cache; empty means ~/.cache/coil.
    cache_dir: str = ""
    #: A pointwise value with more than one user is realized (computed once into a buffer) when its body reads
    #: more than this many buffers; below that it is inlined into each user. 4 keeps transformer residual
    #: streams from being recomputed by every later layer (the same threshold as Inductor's).
    max_inline_reads: int = 4
    #: A ``cat`` whose longest extension (a cat of the same inputs and more, as in a DenseNet block) has at least
    #: this many non-empty inputs is a concat buffer: one storage for the family, each input computed or copied
    #: into its slice once (docs/ir.md, "Concat buffers"); otherwise one pointwise body selecting among the inputs,
    #: inlined into the readers (a where-chain of masked loads per concatenation). 0: never.
    concat_buffer_min_inputs: int = 5
    #: CUDA fp16/bf16 mm/addmm outputs whose row length is not a multiple of 8 get a
    #: padded row stride, so cuBLAS can use its aligned kernels (see ir/graph.py).
    pad_matmul_outputs: bool = True
    #: A bf16 CUDA matmul whose only use is a float32 cast the graph returns (an AMP weight gradient) is one
    #: float32-output cuBLAS product (``aten.mm.dtype``): no cast kernel, no bf16 rounding of the gradient
    #: (coil/ir/upcast_matmul.py). H100, LLaMA 4x2048 AMP step: 7.73 -> 7.33 ms device time (BENCHMARKS.md).
    matmul_float32_grads: bool = True
    #: A user output that is such a padded matmul result (an LM head's logits) is returned with its padded row
    #: stride, as torch.compile returns it, instead of being copied to eager's contiguous strides (a read and a
    #: write of the whole output: 0.95 ms of XLM-R's 10 ms bf16 step on an H200). Values, shape and dtype are
    #: eager's; ``stride(-2)`` is the padded row length and ``is_contiguous()`` is False. False copies.
    keep_padded_matmul_outputs: bool = True
    #: A kernel stores an output over an input buffer that no later step reads, when the two have one layout and
    #: every load of the input is at the output's index (codegen/common.py, ``KernelPlan.inplace``): peak memory.
    inplace_buffers: bool = True
    #: CUDA graphs with 2-D convolutions run them channels-last: convolution and pooling inputs, their outputs
    #: and the pointwise buffers computed from them are laid out (N, H, W, C) in memory, so cuDNN needs no
    #: NCHW<->NHWC transposes (docs/ir.md, "Channels-last convolutions", with the H200 A/B).
    conv_channels_last: bool = True
    #: ``conv_channels_last`` in training graphs too (the forward and backward of a graph that requires grad;
    #: the H200 training steps behind the default: BENCHMARKS.md, "Channels-last training").
    conv_channels_last_training: bool = True
    #: With ``conv_channels_last``: a convolution weight that is a graph input (a
    #: module's parameter) is copied channels-last by a generated kernel (True) or
    #: passed as it is, so that ATen's convolution makes the copy in C++ (False).
    conv_channels_last_weights: bool = True
    #: CUDA convolutions with a bias run without it and ``+ bias`` joins the next
    #: kernel (cuDNN adds a bias with a kernel of its own; ir/lowering_conv.py).
    conv_bias_epilogue: bool = True
    #: CUDA 1x1 convolutions of 1x1 images (squeeze-excitation) with at most this many
    #: multiply-adds are a generated reduction instead of a cuDNN call; 0 turns it off.
    conv_matvec_max_macs: int = 1 << 21
    #: ``max_pool2d_with_indices`` (window max and ATen's indices) and its backward are generated pointwise values,
    #: fused with the BatchNorm + ReLU before them (else ATen's kernels; ir/lowering_conv.py).
    lower_max_pool: bool = True
    #: ``avg_pool2d`` with every window inside the image, and its backward where windows do not overlap (DenseNet's
    #: transitions), are generated pointwise values fused with their neighbours (else ATen's kernels).
    lower_avg_pool: bool = True
    #: Fuse nodes in the scheduler. Off gives one kernel per buffer (debugging).
    fusion: bool = True
    #: An inference graph's ``index_copy_`` / ``index_put_`` / ``scatter_`` of an input (a KV cache) writes into the
    #: input itself instead of a copy the runtime copies back (docs/ir.md, "Inputs written in place").
    inplace_input_writes: bool = True
    #: Fuse pointwise kernels that read only graph inputs (parameter casts under autocast, channels-last
    #: weight copies) and have the same size and access pattern into one kernel, to save launches, when each
    #: has at most this many elements; 0 turns it off (schedule/scheduler.py). The fused kernel runs where the
    #: first of them ran, so its outputs live longer: the cap bounds that.
    launch_fusion_max_numel: int = 1 << 24
    #: Record each compiled graph on CUDA as a CUDA graph and replay it, all graphs of a device sharing one
    #: memory pool (mode="reduce-overhead" turns this on; docs/cudagraphs.md).
    cudagraphs: bool = False
    #: Recordings of one compiled graph (new sizes, moved static inputs, new places
    #: in a step) after which new ones run without a CUDA graph (logged).
    cudagraph_record_limit: int = 8
    #: Before each CUDA graph capture, give the default pool's unused cached memory back
    #: (torch.cuda.empty_cache): the un-graphed warm-up and dry run leave the graph's
    #: working set cached there while its replays use the graph pool (logged).
    cudagraph_release_cache: bool = True
    #: A backward recorded as a CUDA graph reuses the memory of the forward's saved activations as it releases
    #: each after its last use (docs/cudagraphs.md, "Saved activations").
    cudagraph_reuse_saved: bool = True
    #: Dynamic shapes: None (automatic), True or False (coil.compile's ``dynamic``; docs/dynamic_shapes.md).
    dynamic: Any = None
    #: Capture ``Tensor.item()`` / ``tolist()`` as graph ops returning unbacked symbolic
    #: numbers instead of graph breaks (torch.compile's option of that name).
    capture_scalar_outputs: bool = False
    #: Capture ops whose output size depends on data (``nonzero``, ``masked_select``, boolean-mask indexing,
    #: ``unique``...) with unbacked symbolic sizes instead of graph breaks (torch.compile's option of that name).
    capture_dynamic_output_shape_ops: bool = False
    #: Turn every fallback from coil's own kernels to ATen ops or the FX interpreter caused by an internal
    #: failure (a graph whose code generation raised, a kernel the GPU compiler rejected) into a
    #: ``coil.exc.StrictCodegenError`` instead of a warning (``coil.exc.refuse_fallback``). Ops without a
    #: lowering still run as extern kernels: that is by design, not a failure. For tests and the bench.
    strict_codegen: bool = False
    #: Turn a capture that fell back to running the frame eagerly because of an internal error (an exception that
    #: is not a deliberate ``Unsupported``) into that error instead of a warning. For tests (``COIL_STRICT_CAPTURE=1``).
    strict_capture: bool = False
    #: Extra C++ compiler flags appended to the defaults.
    cpp_extra_flags: str = ""
    #: OpenMP threads for C++ kernels; 0 follows torch.get_num_threads().
    cpp_threads: int = 0
    #: Print graph breaks to stderr as they happen (they are always logged).
    verbose: bool = False

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def option_names() -> list[str]:
    """The valid option names, sorted."""
    return sorted(f.name for f in fields(Config))


_OPTION_NAMES = frozenset(option_names())
#: The values of the enumerated options (a kernel backend registered with
#: ``coil.codegen.backend.register_kernel_backend`` is a valid ``cpu_backend`` too).
_CHOICES = {"cpu_backend": ("cpp", "triton"), "partitioner": ("min_cut", "default"), "dynamic": (None, True, False)}


def option_choices(name: str) -> Optional[tuple]:
    """The valid values of option ``name``, or None when it is not enumerated."""
    if name == "cpu_backend":
        registered = getattr(sys.modules.get("coil.codegen.backend"), "_BACKENDS", {})
        return tuple(dict.fromkeys(_CHOICES[name] + tuple(registered)))
    return _CHOICES.get(name)


def check_option_names(options: dict) -> None:
    """Raise ``ValueError`` naming every unknown key of ``options`` and the valid ones, and every value of an
    enumerated option that is not one of its values. (Per call of a compile with options: :func:`patch` runs it.)"""
    if unknown := sorted(set(options) - _OPTION_NAMES):
        raise ValueError(f"unknown coil option(s) {unknown}; valid options are: {', '.join(option_names())}")
    if bad := [f"{k}={v!r} (valid values: {', '.join(map(repr, option_choices(k)))})" for k, v in options.items()
               if k in _CHOICES and v not in option_choices(k)]:
        raise ValueError(f"invalid value of coil option(s): {'; '.join(bad)}")


def _coerce(value: str, default: Any) -> Any:
    low = value.strip().lower()
    if isinstance(default, bool):
        return low in ("1", "true", "yes", "on")
    if default is None:
        return {"1": True, "true": True, "0": False, "false": False}.get(low)
    return type(default)(value) if isinstance(default, (int, float)) else value


def _from_env() -> Config:
    cfg = Config()
    for name in option_names():
        if (raw := os.environ.get("COIL_" + name.upper())) is not None:
            setattr(cfg, name, value := _coerce(raw, default := getattr(cfg, name)))
            if name in _CHOICES and value not in option_choices(name) or isinstance(default, bool) and \
                    raw.strip().lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
                warnings.warn(f"COIL_{name.upper()}={raw!r} is not a value of option {name} (valid: "
                              f"{option_choices(name) or 'true / false'}); it reads as {value!r}")
    return cfg


#: The options in force. Per-compile options are applied with :func:`patch`.
config: Config = _from_env()


class patch:
    """Temporarily change options: ``with coil.config.patch(fusion=False): ...`` (``as`` gives the config).

    A plain class, not a generator: a compiled function with options makes one and enters it on every call, also
    re-entrantly (a recursive call). Raises ValueError on unknown option names."""

    def __init__(self, **changes: Any):
        check_option_names(changes)
        self.changes, self._saved = changes, []

    def __enter__(self) -> Config:
        d = config.__dict__
        self._saved.append({k: d[k] for k in self.changes})
        d.update(self.changes)
        return config

    def __exit__(self, *exc) -> None:
        config.__dict__.update(self._saved.pop())


class _ConfigModule(types.ModuleType):
    """``coil.config.<option>`` reads and sets the option on :data:`config` (an assignment made a module
    attribute nothing read); assigning another new public name raises AttributeError."""

    def __getattr__(self, name: str) -> Any:
        return getattr(config, name) if name in _OPTION_NAMES else types.ModuleType.__getattribute__(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _OPTION_NAMES and name not in self.__dict__ and not name.startswith("_"):
            raise AttributeError(f"coil.config has no option {name!r}; valid options are: {', '.join(option_names())}")
        check_option_names({name: value} if name in _OPTION_NAMES else {})
        setattr(config, name, value) if name in _OPTION_NAMES else types.ModuleType.__setattr__(self, name, value)


sys.modules[__name__].__class__ = _ConfigModule
