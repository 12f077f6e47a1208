"""Attention research workbench for FP8 and sparse attention on MiniMax-H3 and similar video DiTs.

Data flow, one folder per stage: capture -> store -> replay -> variants (attention | kernels)
-> metrics -> viz / report.
"""

__version__ = "0.1.0"
