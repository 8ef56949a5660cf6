"""Corpus rows that fail today, with the first failure reason: the harness marks each
``"<group>::<id>"`` listed here xfail(strict=False). Regenerate the reasons with
``python tests/capture/corpus/corpus_status.py`` and delete a line once its row passes
(an XPASS in the run says which ones).
"""

KNOWN_FAILURES: dict[str, str] = {
    'context_managers::contextlib_contextmanager': "AssertionError: graphs: expected 1, got 0 (ops per graph []); breaks: ['del of an attribute']",
    'graph_breaks::python_random_module': "AssertionError: graphs: expected 1, got 0 (ops per graph []); breaks: ['constructing Random (custom __new__)']",
    'python_builtins::builtins_id_hash': "AssertionError: graphs: expected 1, got 2 (ops per graph [1, 1]); breaks: ['id() of a traced value', 'id() of a traced value']",
    'rng::rng_with_generator_arg': 'AssertionError: graphs: expected 1, got 0 (ops per graph []); breaks: []',
    'sharp_edges::manual_seed_inside_frame': "AssertionError: graphs: expected (1, 2), got 0 (ops per graph []); breaks: ['Generator object', 'attribute __dynamo_disable of <function manual_seed at 0x7f270e033600>', 'call to torch._dynamo.eval_frame._fn (not traced)",
}
