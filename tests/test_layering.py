"""The package's layers, read from its imports (ast): no module imports a higher layer, the torch probe does not
import the model it is checked against, no module uses another module's private names, and none uses Optuna's
private API (not even by a name in a string, or by subclassing).

docs/architecture.md draws these layers; this test keeps the picture true.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from functools import cache
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
    ("front ends", {"cli", "__main__", "argtypes", "estimate", "progress", "report", "study_tools", "train", "ui"}),
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
    # the hook verl's own separate-async trainer overrides to swap its worker class in
    # (verl trainer/ppo/v1/trainer_separate_async.py:114-126); the step switch does the same for its worker
    ("verl/step_switch.py", "_init_resource_pool_mgr"),
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


# Optuna's public modules: their public classes are what autotune may use, and everything private on them is not
OPTUNA_PUBLIC_MODULES = ("optuna", "optuna.storages", "optuna.storages.journal", "optuna.study", "optuna.trial",
                         "optuna.samplers", "optuna.pruners", "optuna.distributions", "optuna.artifacts",
                         "optuna.exceptions")


def optuna_private_names_of(cls: type) -> set[str]:
    """The `_`-prefixed methods and attributes of an Optuna class and its Optuna bases, read from their source."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("optuna"):
            continue
        names |= {n for n in vars(klass) if n.startswith("_") and not n.startswith("__")}
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                  and n.value.id == "self" and n.attr.startswith("_") and not n.attr.startswith("__")}
    return names


@cache
def optuna_private_names() -> frozenset[str]:
    names: set[str] = set()
    for module_name in OPTUNA_PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for public in getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]:
            obj = getattr(module, public)
            if inspect.isclass(obj):
                names |= optuna_private_names_of(obj)
    return frozenset(names)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def optuna_private_uses(path: Path) -> list[str]:
    """Optuna's private API however it is reached: an import of a `_` module or name, `optuna.x._y`, any `obj._y`
    that is a private name of an Optuna class (a study's `._storage`, a trial's `._trial_id`), that name as a
    string (getattr/setattr), and in a subclass of an Optuna class, its private methods and attributes on self."""
    tree = ast.parse(path.read_text())
    imported = {}  # local name -> dotted Optuna name, from `from optuna... import X` and `import optuna...`
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "optuna":
            imported |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
            if any(p.startswith("_") for p in node.module.split(".")):
                bad.append(f"line {node.lineno}: from {node.module}")
            bad += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "optuna":
                    imported[a.asname or a.name.split(".")[0]] = a.asname and a.name or "optuna"
                    if any(p.startswith("_") for p in a.name.split(".")):
                        bad.append(f"line {node.lineno}: import {a.name}")
    private = optuna_private_names()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = _dotted(node.value)
            from_optuna = root is not None and root.split(".")[0] in imported
            self_access = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if from_optuna or (node.attr in private and not self_access):
                bad.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in private:
            bad.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.ClassDef):
            bases = [_dotted(b) for b in node.bases]
            bases = [b for b in bases if b and b.split(".")[0] in imported]
            if not bases:
                continue
            own = set()
            for base in bases:
                head, *rest = base.split(".")
                module_name, _, attr = f"{imported[head]}.{'.'.join(rest)}".strip(".").rpartition(".")
                own |= optuna_private_names_of(getattr(importlib.import_module(module_name), attr))
            for inner in ast.walk(node):
                if isinstance(inner, ast.FunctionDef) and inner.name in own:
                    bad.append(f"line {inner.lineno}: def {inner.name} (overrides Optuna's private method)")
                elif isinstance(inner, ast.Attribute) and inner.attr in own and isinstance(inner.value, ast.Name) \
                        and inner.value.id in ("self", "cls"):
                    bad.append(f"line {inner.lineno}: self.{inner.attr} (Optuna's private attribute)")
    return sorted(dict.fromkeys(bad), key=lambda line: int(line.split()[1].rstrip(":")))  # by line, stable


@pytest.mark.parametrize("name, path", MODULES, ids=[n for n, _ in MODULES])
def test_no_private_optuna_api(name, path):
    assert optuna_private_uses(path) == []


def test_the_optuna_reader_finds_private_use_however_it_is_spelled(tmp_path):
    """What the retry layer did before it wrapped a BaseStorage (setattr of RDBStorage's private methods by name),
    what the driver did before it kept its storage (study._storage, trial._trial_id), and subclass access."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import optuna\nfrom optuna.storages._cached_storage import _CachedStorage\n"
        "from optuna.storages import RDBStorage\n"
        "CALLS = {'get_all_trials', '_get_trials', '_create_new_trial'}\n"
        "class Retrying(optuna.storages.RDBStorage):\n    pass\n"
        "for name in CALLS:\n    setattr(Retrying, name, getattr(optuna.storages.RDBStorage, name))\n"
        "def f(study, trial):\n    return study._storage, trial._trial_id, optuna.study._optimize\n"
        "class Mine(RDBStorage):\n    def _get_trials(self):\n        return self._version_manager\n"
        "class Plain:\n    def f(self):\n        return self._own_name\n")
    assert optuna_private_uses(sample) == [
        "line 2: from optuna.storages._cached_storage", "line 2: imports _CachedStorage", "line 4: '_get_trials'",
        "line 4: '_create_new_trial'", "line 10: ._storage", "line 10: ._trial_id", "line 10: ._optimize",
        "line 12: def _get_trials (overrides Optuna's private method)",
        "line 13: self._version_manager (Optuna's private attribute)"]


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
