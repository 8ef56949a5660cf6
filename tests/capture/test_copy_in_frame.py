"""``copy.deepcopy`` of a configuration object inside a compiled frame.

transformers' ``PreTrainedConfig.get_text_config(decoder=True)`` deep-copies a flat encoder-decoder config (T5, BART's
legacy layout) and ``DynamicCache(config=...)`` calls it in every decoder forward with ``use_cache``: coil skips the
``copy`` module (``SKIP_MODULES``), so each T5 forward graph-breaks there (12 breaks and 8 graphs for a 2-layer
``T5ForConditionalGeneration`` over three calls; torch.compile: 1 graph, no break, as dynamo inlines ``copy``).
Tracing ``copy.deepcopy`` itself needs ``id()``-keyed memo dicts, ``__reduce_ex__`` and ``copyreg.__newobj__``,
and then ``PreTrainedConfig.to_dict``/``__setattr__`` on the copy (tried: 16 further breaks)."""
import copy

import pytest
import torch

import coil
from coil.capture.frame import stats


class Config:
    def __init__(self):
        self.d_model = 4
        self.decoder_layers = 2
        self.names = ["a", "b"]


CFG = Config()


@pytest.mark.xfail(strict=True, reason="copy.deepcopy of a user object is a graph break (the copy module is not "
                                       "traced); torch.compile inlines it")
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
