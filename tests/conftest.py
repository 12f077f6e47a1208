import os

import pytest
import torch
from hypothesis import settings

# The property tests draw the same examples on every run: a fresh clone has no example database,
# so random draws would make a CI run pass or fail by chance. HYPOTHESIS_PROFILE=explore draws
# new examples (more of them) to look for failures.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Without CUDA every Triton kernel runs in the interpreter. Set before any test module imports
# triton or the kernels: @triton.jit picks its mode when a kernel is defined, so a module collected
# early (e.g. a compile-only test) must not leave the kernels in compiled mode for later files.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
