"""Kernels: one folder per op (reference.py, triton.py, dispatch in __init__.py)."""
