"""Shared pytest set-up: GPU tests skip cleanly without CUDA; helpers importable from tests/; torch on one
CPU thread."""
import os
import sys

import torch

# Without a GPU, Triton kernels run through Triton's interpreter. It must be chosen before anything
# imports triton (triton sets up its language functions at import), so it is set here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

# The models and kernels under test are small: on a CPU shared with other jobs one intra-op thread runs
# them several times faster than many (OpenMP threads that wait for a busy core spin). Tests that need
# another setting set it themselves (and restore it).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
