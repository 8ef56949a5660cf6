"""``copy.deepcopy`` of a configuration object inside a compiled frame.

transformers' ``PreTrainedConfig.get_text_config(decoder=True)`` deep-copies a flat encoder-decoder config (T5, BART's
legacy layout) and ``DynamicCache(config=...)`` calls it in every decoder forward with ``use_cache``: coil skips the
``copy`` module (``SKIP_MODULES``), so each T5 forward graph-breaks there (12 breaks and 8 graphs for a 2-layer
``T5ForConditionalGeneration`` over three calls; torch.compile: 1 graph, no break, as dynamo inlines ``copy``).
The copy is now made of trackers (``builtins.copy_value``): one graph, the original's ``__dict__`` guarded."""
import copy

import torch

import coil
from coil.capture.frame import stats


class Config:
    def __init__(self):
        self.d_model = 4
        self.decoder_layers = 2
        self.names = ["a", "b"]


CFG = Config()


def test_deepcopy_of_a_config_object_is_not_a_graph_break():
    def f(x):
        c = copy.deepcopy(CFG)
        c.d_model = 8
        return x * c.d_model + len(c.names)
    coil.reset()
    x = torch.randn(3)
    torch.testing.assert_close(coil.compile(f)(x), x * 8 + 2)
    assert CFG.d_model == 4
    assert stats["graph_breaks"] == 0
