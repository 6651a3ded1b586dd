"""Benchmarks and experiment drivers of units-lightning, run as scripts (``python benchmarks/<name>.py``) or as
modules (``python -m benchmarks.<name>``); their shared helpers are in ``benchmarks.common``.

Not part of the installed package: they measure it (engines, fits, data loading, several GPUs, memory over time)
and run the paper's tables (``benchmarks/paper_tables.py``, the ``benchmarks.tables`` package).
"""
