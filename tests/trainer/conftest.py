"""Shared fixtures of the trainer tests."""

from __future__ import annotations

import pytest

from .runner import assert_ok, run_trainer


@pytest.fixture(scope="session")
def reference_losses(tmp_path_factory) -> list[float]:
    """Losses of the 1x1x1 run every parallel layout must reproduce."""
    run = run_trainer(tmp_path_factory.mktemp("ref"), 1, "--train-iters", "10", "--no-profile")
    assert_ok(run)
    return run.losses()
