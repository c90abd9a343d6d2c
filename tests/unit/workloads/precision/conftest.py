"""Shared fixtures for the precision tests."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    """These tensors are tiny: intra-op threads only add sync overhead (4x slower on a busy
    2-core runner). Restored afterwards so other test packages keep their setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
