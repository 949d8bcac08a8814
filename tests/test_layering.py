"""The package's layers, read from its imports (ast): no module imports a higher layer, the torch probe does not
import the model it is checked against, and no module uses another module's private names.

docs/architecture.md draws these layers; this test keeps the picture true.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"

# Bottom to top; a unit is a top-level module or sub-package of autotune. A module may import its own layer and
# those below it.
LAYERS: list[tuple[str, set[str]]] = [
    ("facts", {"autotune", "errors", "hardware", "models", "model_config", "workload", "interrupt"}),
    ("verl's rules and the search space", {"verl", "spaces"}),
    ("what the user asks", {"config"}),
    ("the analytic model", {"model"}),
    ("backends and storage", {"backends", "storage"}),
    ("the search", {"search"}),
    ("front ends", {"cli", "__main__", "argtypes", "estimate", "progress", "report", "study_tools", "ui"}),
]
LAYER_OF = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}

# Private names of other packages used on purpose, each with its reason.
FOREIGN_PRIVATE_ALLOWED = {
    # Hydra's own last step of compose(), applied to a cached defaults tree: the same result ~30x faster
    ("verl/compose.py", "_apply_overrides_to_config"),
    ("verl/compose.py", "hydra._internal.config_loader_impl"),
    # exactly the call verl's FSDP engine makes (verl engine/fsdp/transformer_impl.py:307-316)
    ("backends/torch/probe/modeling.py", "_apply_liger_kernel_to_instance"),
    # the judge's run only: OmegaConf's interpolation parser, a pure function, cached; verdicts identical with and
    # without (benchmarks/verl_judge_speed.py)
    ("verl/judge.py", "_utils"),
}
# documented public names that start with an underscore: namedtuple's methods, os._exit
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_exit"}


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path))
    return out


def unit_of(module: str) -> str:
    parts = module.split(".")
    return "autotune" if len(parts) == 1 else parts[1]


def autotune_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, imported names) for every import of autotune, lazy ones inside functions included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "autotune":
            names = [a.name for a in node.names]
            if node.module == "autotune":  # `from autotune import interrupt`: the submodules are what is imported
                found += [(node.lineno, f"autotune.{n}", []) for n in names if not n.startswith("__")]
            else:
                found.append((node.lineno, node.module, names))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "autotune"]
    return found


MODULES = modules()


def test_every_unit_has_a_layer():
    units = {unit_of(name) for name, _ in MODULES}
    assert units - set(LAYER_OF) == set(), "place the new module in a layer (and in docs/architecture.md)"


@pytest.mark.parametrize("name, path", MODULES, ids=[n for n, _ in MODULES])
def test_no_module_imports_a_higher_layer(name, path):
    own = LAYER_OF[unit_of(name)]
    upward = [f"line {line}: {module} ({LAYERS[LAYER_OF[unit_of(module)]][0]})"
              for line, module, _ in autotune_imports(path) if LAYER_OF[unit_of(module)] > own]
    assert upward == [], f"{name} is in layer {LAYERS[own][0]!r} but imports from above it"


def test_the_torch_probe_does_not_import_the_model_it_is_checked_against():
    probe = [(n, p) for n, p in MODULES if n.startswith("autotune.backends.torch")]
    assert probe
    for name, path in probe:
        assert [m for _, m, _ in autotune_imports(path) if unit_of(m) == "model"] == [], name


def test_the_model_imports_no_backend_search_storage_or_front_end():
    for name, path in MODULES:
        if unit_of(name) == "model":
            assert [m for _, m, _ in autotune_imports(path) if LAYER_OF[unit_of(m)] > LAYER_OF["model"]] == [], name


def private_uses(path: Path, rel: str) -> list[str]:
    """`from x._y import z`, `from x import _y`, and `obj._y` (obj not self/cls): another module's internals."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if any(p.startswith("_") and not p.startswith("__") for p in node.module.split(".")) \
                    and (rel, node.module) not in FOREIGN_PRIVATE_ALLOWED:
                bad.append(f"line {node.lineno}: from {node.module}")
            bad += [f"line {node.lineno}: imports {a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__") and (rel, a.name) not in FOREIGN_PRIVATE_ALLOWED]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr not in PUBLIC_UNDERSCORE and (rel, node.attr) not in FOREIGN_PRIVATE_ALLOWED:
                bad.append(f"line {node.lineno}: .{node.attr}")
    return bad


@pytest.mark.parametrize("name, path", MODULES, ids=[n for n, _ in MODULES])
def test_no_private_names_of_another_module(name, path):
    assert private_uses(path, str(path.relative_to(PACKAGE))) == []


def test_the_readers_see_lazy_imports_and_private_access(tmp_path):
    """A check that cannot fail proves nothing: the readers above find what they look for."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f(study, row):\n    from autotune.search.driver import run_study\n"
                      "    from autotune.search import _hidden\n    row._replace(a=1)\n    return study._storage\n")
    assert [m for _, m, _ in autotune_imports(sample)] == ["autotune.search.driver", "autotune.search"]
    assert private_uses(sample, "sample.py") == ["line 3: imports _hidden", "line 5: ._storage"]
    assert LAYER_OF[unit_of("autotune.search.driver")] > LAYER_OF[unit_of("autotune.model.memory")]


def test_the_architecture_picture_names_every_unit_in_its_layer():
    """docs/architecture.md draws the layers bottom-up, numbered 1..N; each unit appears on its layer's lines."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    picture = text.split("## Layers", 1)[1].split("```")[1]
    rows: dict[int, str] = {}
    current = None
    for line in picture.splitlines():
        head = line[:3].strip()
        if head.isdigit():
            current = int(head)
        if current is not None:
            rows[current] = rows.get(current, "") + " " + line
    assert sorted(rows) == list(range(1, len(LAYERS) + 1))
    for i, (_, units) in enumerate(LAYERS):
        for unit in units - {"autotune"}:
            assert unit in rows[i + 1], f"{unit} is not drawn in layer {i + 1} of docs/architecture.md"
