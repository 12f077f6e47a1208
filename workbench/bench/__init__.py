"""Timing harness and side-by-side attention benchmarks (``workbench bench``)."""
