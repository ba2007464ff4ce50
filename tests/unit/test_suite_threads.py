"""The suite's own set-up (tests/conftest.py): beside another xdist worker, every test starts on one torch thread."""

from __future__ import annotations

import pytest
import torch

from tests.helpers_cli import beside_another_worker


def test_a_test_beside_another_worker_starts_on_one_torch_thread():
    if not beside_another_worker():
        pytest.skip("one process has the cores to itself: conftest leaves its thread count alone")
    # tests/unit/test_vision_plumbing.py, collected after this module, sets two threads at import
    assert torch.get_num_threads() == 1
