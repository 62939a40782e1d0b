import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests share a small machine: one torch thread, as training uses by default."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
