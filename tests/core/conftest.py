"""Fixtures for the core tests (helpers live in core_helpers.py)."""

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)
