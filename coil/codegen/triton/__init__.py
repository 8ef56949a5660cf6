"""Triton code generation (GPU; CPU tests run it under ``TRITON_INTERPRET=1``)."""
