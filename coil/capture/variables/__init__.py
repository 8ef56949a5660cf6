"""VariableTrackers: one class per kind of Python value the translator understands.

- :mod:`.base`: the interface, constants, NULL and cells;
- :mod:`.tensor`: tensors (FX nodes + fake tensors) and :func:`~.tensor.call_op`;
- :mod:`.containers`: tuples, lists, dicts, sets, slices, iterators;
- :mod:`.functions`: Python functions, closures, bound methods, partials;
- :mod:`.objects`: nn.Modules, user objects and classes, modules, ModelOutput;
- :mod:`.builtins`: ``len``/``isinstance``/``range``... and pure C functions;
- :mod:`.torchfn`: torch functions and grad-mode / autocast context managers;
- :mod:`.builder`: real value + source → tracker + guards."""
