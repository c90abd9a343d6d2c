from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def one_torch_thread():
    """Tiny models: one thread is as fast, and immune to oversubscription on a shared box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
