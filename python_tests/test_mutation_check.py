"""The mutation check's list stays in step with the sources: every seeded fault of
scripts/mutation_check.py still applies (its text occurs exactly once in its file), changes the
file, and names tests that exist. The check itself (rebuilding the emulator per mutant) runs in
CI from .ci/run."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "scripts" / "mutation_check.py")
mutation_check = sys.modules["mutation_check"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutation_check)


def test_names_are_unique():
    names = [m.name for m in mutation_check.MUTATIONS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("mutation", mutation_check.MUTATIONS, ids=lambda m: m.name)
def test_mutation_applies_to_the_sources(mutation, tmp_path):
    target = tmp_path / mutation.file
    target.parent.mkdir(parents=True)
    original = (ROOT / "csrc" / mutation.file).read_text()
    target.write_text(original)
    assert mutation_check.apply(mutation, tmp_path) is None
    assert target.read_text() != original
    assert all((ROOT / t).exists() for t in mutation.tests if t.endswith(".py"))
