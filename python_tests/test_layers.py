"""The package's layers hold (ARCHITECTURE.md): every import of a package module, at the top of
a file or inside a function, goes to a module of the same layer or of a layer below, and the
executable specification (``reference``) and the typed wrappers (``ops``) never import each
other."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specdec_kernels"

# Bottom up; a module belongs to the layer of its longest listed prefix.
LAYERS = [
    ["types", "sampling", "tree", "data", "drafters", "_C", "_build_config"],  # plain data
    ["ops", "reference"],  # the kernels' typed wrappers and their specification
    ["models", "compat", "eagle", "medusa", "retrieval", "weight_files"],  # adapters and drafter assets: HF
    # models, other engines' signatures, the EAGLE and Medusa networks and their file formats,
    # retrieval datastores
    ["decoding"],  # the decoding loop and its drafters
    ["training"],  # builders of drafter assets: they decode with the target to make data
    ["hf", "cli", "bench", "demo", "__init__"],  # what users call
]
NEVER = [("reference", "ops"), ("ops", "reference")]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def layer_of(module: str) -> int | None:
    best, found = -1, None
    for layer, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), layer
    return found


def imported_modules(path: Path) -> set:
    """Package modules ``path`` imports (``specdec_kernels.`` stripped)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            base = PACKAGE.joinpath(*node.module.split(".")[1:])
            names += [f"{node.module}.{a.name}" for a in node.names
                      if (base / f"{a.name}.py").is_file() or (base / a.name).is_dir()]
        else:
            continue
        for name in names:
            if name == "specdec_kernels":
                continue
            if name.startswith("specdec_kernels."):
                out.add(name.removeprefix("specdec_kernels."))
    return out


FILES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    assert [module_name(p) for p in FILES if layer_of(module_name(p)) is None] == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: module_name(p))
def test_imports_run_down_the_layers(path):
    here = module_name(path)
    assert layer_of(here) is not None, f"{here} has no layer"
    for target in imported_modules(path):
        assert layer_of(target) is not None, f"{here} imports {target}, which has no layer"
        assert layer_of(target) <= layer_of(here), f"{here} imports {target}, a layer above it"
        for low, high in NEVER:
            assert not (here.startswith(low) and target.startswith(high)), (
                f"{here} imports {target}: {low} and {high} stay independent"
            )
