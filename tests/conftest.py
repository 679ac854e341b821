"""Shared fixtures: small random checkpoints of each family, the embedded model, and the reference."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from core.env import home_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def session_home() -> Path:
    """A MINISGL_HOME of the run's own, so that what the kernels derive from the suite's many throwaway checkpoints
    is cached as a user's start has it (every later load of a model reads it back) and gone after the run; the
    converted models and the built C kernels are the real home's, linked in (converted and built once, as for a
    user). The derived cache has tests of its own (tests/cli/test_derived_cache.py), in homes of their own."""
    real, home = home_dir(), Path(tempfile.mkdtemp(prefix="minisgl-test-home-"))
    for shared in ("models", "kernels"):
        (real / shared).mkdir(parents=True, exist_ok=True)
        (home / shared).symlink_to(real / shared, target_is_directory=True)
    return home


SESSION_HOME = session_home()
os.environ["MINISGL_HOME"] = str(SESSION_HOME)  # the command's processes that the tests start inherit it

import pytest  # noqa: E402

from tests.support.models import FAMILIES, save_random_model  # noqa: E402
from tests.support.skips import skip_line  # noqa: E402


def pytest_unconfigure(config) -> None:
    shutil.rmtree(SESSION_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    """One seeded random checkpoint per family (plus variants), built once per test session."""
    root = tmp_path_factory.mktemp("models")
    dirs = {family: str(save_random_model(root / family, family)) for family in FAMILIES}
    dirs["llama3-rope-tied"] = str(save_random_model(
        root / "llama3", "llama", seed=1, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}))
    return dirs


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The embedded model, converted once into the cache (about 30 s the first time)."""
    from core.models.weights import resolve_model_dir

    return str(resolve_model_dir(None))


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``gpu`` need CUDA: skipped (not failed) on a machine without it, as in CI."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="a GPU test: needs CUDA, which this machine lacks")
    for item in items:
        # the marker, not ``item.keywords``, which also holds the names of the folders above (a checkout called gpu)
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the pages' tests (skipped, with the reason, where it is not installed)."""
    from tests.support.browser import missing, open_browser

    reason = missing()
    if reason:
        pytest.skip(reason)
    driver = open_browser()
    yield driver
    driver.quit()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """One line at the end, after pytest's own summary: how many tests skipped and why, so a fresh machine says
    what it lacks."""
    yield
    stats = terminalreporter.stats
    ran = sum(len(stats.get(key, [])) for key in ("passed", "failed", "skipped", "error"))
    line = skip_line(stats.get("skipped", []), ran)
    if line:
        terminalreporter.write_line(line)
