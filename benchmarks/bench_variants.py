"""coil with one option changed, as bench compilers for A/B rows in one paired run:

    coil bench --paired --mode train --model timm_resnet50 \
        --compiler eager coil benchmarks.bench_variants:COIL_NOCL benchmarks.bench_variants:COIL_NOLF

(run from the repository root, so that ``benchmarks`` is importable).
"""
from coil.bench.compilers import Compiler, _compile_coil

#: conv_channels_last off (NCHW convolutions)
COIL_NOCL = Compiler("coil_nocl", "coil", "coil, conv_channels_last=False",
                     _compile_coil("coil", conv_channels_last=False))
#: launch-saving horizontal fusion off
COIL_NOLF = Compiler("coil_nolf", "coil", "coil, launch_fusion_max_numel=0",
                     _compile_coil("coil", launch_fusion_max_numel=0))
#: channels-last convolutions in training graphs too
COIL_CLT = Compiler("coil_clt", "coil", "coil, conv_channels_last_training=True",
                    _compile_coil("coil", conv_channels_last_training=True))
