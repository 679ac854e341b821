"""Inside core, a lower layer never imports an upper one, and no modules import one another in a cycle: walk
every module's imports (those inside functions and behind TYPE_CHECKING too) and check each against the layer
order and the whole graph for cycles.

A module in a package takes the package's layer; the loose modules at the top of core are placed one by one,
so a new one has to be given a place here before this test passes.

The top-level packages are layered the same way: minisgl_cli over render and serving, both over core; core
imports none of the others, and render and serving do not import each other or minisgl_cli.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core"

# the order, lowest first; packages or modules on one line share a layer and may import one another
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "request", "events", "env", "config", "generation", "model_config", "transfer", "arith", "words",
     "cpu_share", "constraint"),
    ("kvcache", "distributed", "kernels", "layers", "attention", "constrain"),
    ("models",),
    ("engine",),
    ("scheduler",),
    ("llm",),
    ("bench", "__init__"),
)
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}

# each top-level package -> the others it may import
PACKAGES: dict[str, set[str]] = {
    "core": set(),
    "render": {"core"},
    "serving": {"core"},
    "minisgl_cli": {"core", "render", "serving"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def layer_of(module: str) -> int:
    """core.X... -> the layer of X (core itself is its package façade, at the top)."""
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    if key not in LEVEL:
        raise AssertionError(f"core.{key} has no place in LAYERS (tests/test_layering.py): give it one")
    return LEVEL[key]


def is_module(name: str) -> bool:
    path = CORE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path, module_level_only: bool = False, roots: tuple[str, ...] = ("core",)) \
        -> list[tuple[int, str]]:
    """(line, module) for every module under ``roots`` that ``path`` imports, wherever the import statement
    stands (or only those run when the module is imported)."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body if module_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in roots]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in roots:
            subs = [f"{node.module}.{a.name}" for a in node.names if is_module(f"{node.module}.{a.name}")]
            found += [(node.lineno, m) for m in subs] if subs else [(node.lineno, node.module)]
    return found


def core_modules() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def test_every_core_module_is_walked():
    assert len(core_modules()) > 50 and all(layer_of(module_name(p)) >= 0 for p in core_modules())


def test_no_core_module_imports_a_higher_layer():
    upward = []
    for path in core_modules():
        here = module_name(path)
        for line, target in imports_of(path):
            if layer_of(target) > layer_of(here):
                upward.append(f"{path.relative_to(CORE.parent)}:{line} imports {target}")
    assert not upward, "imports that run up the layering:\n" + "\n".join(upward)


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in ``graph`` (module -> the modules it imports), or None."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as err:
        return list(err.args[1])
    return None


def test_no_import_cycle():
    """No two modules import each other, directly or around a loop, in one package or across layers: imports
    inside functions and behind TYPE_CHECKING count too (a cycle means a piece both need belongs lower down)."""
    cycle = import_cycle({module_name(p): {m for _, m in imports_of(p)} for p in core_modules()})
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_walk_sees_a_cycle_inside_one_package(tmp_path):
    """The check itself: two modules of one package importing each other, one of them inside a function."""
    (tmp_path / "a.py").write_text("from core.kernels.b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from core.kernels.a import g\n")
    graph = {f"core.kernels.{n}": {m for _, m in imports_of(tmp_path / f"{n}.py")} for n in "ab"}
    assert graph == {"core.kernels.a": {"core.kernels.b"}, "core.kernels.b": {"core.kernels.a"}}
    assert import_cycle(graph) is not None


def test_the_walk_sees_an_upward_import(tmp_path):
    """The check itself: an import of the engine from a layer module (here inside a function) is found."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from core.engine.engine import Engine\n    from core import env\n")
    assert imports_of(source) == [(2, "core.engine.engine"), (3, "core.env")]
    assert layer_of("core.engine.engine") > layer_of("core.layers.linear")


# the wings of fast paths (docs/ARCHITECTURE.md), and the engine's modules that choose, describe and install them;
# every other module outside core/kernels and core/bench is the reference path, which runs without them
WINGS = ("core.kernels.cpu", "core.kernels.cuda")
WING_SEAMS = frozenset({"core.engine.plan", "core.engine.describe", "core.engine.engine"})


def wing_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for each import of a wing's module in ``path``."""
    return [(line, target) for line, target in imports_of(path)
            if any(target == wing or target.startswith(wing + ".") for wing in WINGS)]


def test_the_reference_path_imports_no_wing():
    """The layers, models, attention, KV cache, sampler, scheduler and LLM run as written with every fast path off:
    what a wing gives them (a screen on the LM head, the sampler's kernels) reaches them through the plan or the
    wing's install call, never by an import."""
    reference = [p for p in core_modules() if module_name(p).split(".")[1:2] not in (["kernels"], ["bench"])
                 and module_name(p) not in WING_SEAMS]
    assert len(reference) > 40
    wrong = [f"{path.relative_to(CORE.parent)}:{line} imports {target}"
             for path in reference for line, target in wing_imports(path)]
    assert not wrong, "the reference path imports a wing:\n" + "\n".join(wrong)


def test_the_walk_sees_a_wing_import(tmp_path):
    """The check itself: a wing's module imported inside a function, and a name from a wing's package, are found;
    the shared kernels modules are not."""
    source = tmp_path / "probe.py"
    source.write_text("from core.kernels.sampling import mix\nfrom core.kernels.cuda import install\n\n"
                      "def f():\n    from core.kernels.cpu.screened_head import ScreenedHead\n")
    assert wing_imports(source) == [(2, "core.kernels.cuda.install"), (5, "core.kernels.cpu.screened_head")]


def imports_across_packages(package: str, path: Path) -> list[tuple[int, str]]:
    """(line, module) for each import in ``path``, a module of ``package``, of a top-level package it may not
    import."""
    return [(line, target) for line, target in imports_of(path, roots=tuple(PACKAGES))
            if target.split(".")[0] not in PACKAGES[package] | {package}]


def test_no_top_level_package_imports_one_it_may_not():
    files = {package: sorted((CORE.parent / package).rglob("*.py")) for package in PACKAGES}
    assert all(len(paths) >= 4 for paths in files.values())
    wrong = [f"{path.relative_to(CORE.parent)}:{line} imports {target}"
             for package, paths in files.items() for path in paths
             for line, target in imports_across_packages(package, path)]
    assert not wrong, "imports across the top-level packages that run up or sideways:\n" + "\n".join(wrong)


def test_the_walk_sees_an_import_across_packages(tmp_path):
    """The check itself: render imported inside a function, serving at module level, are found where they may
    not be, and core is not."""
    source = tmp_path / "probe.py"
    source.write_text("import serving.wire\nfrom core.events import StepEvent\n\n"
                      "def f():\n    from render.style import one_line\n")
    assert imports_across_packages("serving", source) == [(5, "render.style")]
    assert imports_across_packages("core", source) == [(1, "serving.wire"), (5, "render.style")]
    assert imports_across_packages("minisgl_cli", source) == []


# what core is built without (docs/ARCHITECTURE.md): terminal views, the command line, HTTP and HTML
NOT_IN_CORE = frozenset({"rich", "typer", "click", "fastapi", "starlette", "uvicorn", "httpx", "requests",
                         "aiohttp", "urllib", "http", "html", "jinja2", "openai"})


def outside_imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level name) for every absolute import in ``path``, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_core_imports_no_terminal_command_line_http_or_html_library():
    wrong = [f"{path.relative_to(CORE.parent)}:{line} imports {name}" for path in core_modules()
             for line, name in outside_imports(path) if name in NOT_IN_CORE]
    assert not wrong, "core imports what belongs to render/ or minisgl_cli/:\n" + "\n".join(wrong)


def test_the_walk_sees_a_library_imported_inside_a_function(tmp_path):
    """The check itself: an HTTP client imported where it runs, and a submodule's package, are found."""
    source = tmp_path / "probe.py"
    source.write_text("import torch\n\ndef f():\n    import httpx\n    from rich.console import Console\n")
    assert [(line, name) for line, name in outside_imports(source) if name in NOT_IN_CORE] == \
        [(4, "httpx"), (5, "rich")]


ROOT = CORE.parent
SCHEDULER = CORE / "scheduler"


def private_members(path: Path, class_name: str) -> set[str]:
    """The underscore names a class defines: its methods and what its methods assign on ``self``."""
    cls = next(n for n in ast.walk(ast.parse(path.read_text(), str(path)))
               if isinstance(n, ast.ClassDef) and n.name == class_name)
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    names |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
              and isinstance(n.value, ast.Name) and n.value.id == "self"}
    return {n for n in names if n.startswith("_") and not n.endswith("__")}


def private_uses(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) for every ``<other>.<name>`` in ``path`` with ``name`` among ``names``: on anything but
    ``self``, or on ``self`` too inside a subclass of Scheduler (another class may have a ``self._rng`` of its own)."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    subclasses = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                  and any(isinstance(b, ast.Name) and b.id == "Scheduler" for b in c.bases)]
    in_subclass = {id(n) for c in subclasses for n in ast.walk(c)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr in names:
            on_self = isinstance(n.value, ast.Name) and n.value.id == "self"
            if not on_self or id(n) in in_subclass:
                found.append((n.lineno, n.attr))
    return found


def test_nothing_outside_the_scheduler_package_touches_a_schedulers_underscore_members():
    """core/llm, the loops' callers and the tensor-parallel workers use the Scheduler's public face (its
    docstring lists it); its underscore members are its own, so they can change without a search."""
    names = private_members(SCHEDULER / "scheduler.py", "Scheduler")
    assert {"_run_loop", "_scheduled", "_freed_by_reset"} <= names
    files = [p for package in ("core", "render", "serving", "minisgl_cli", "tests")
             for p in sorted((ROOT / package).rglob("*.py")) if SCHEDULER not in p.parents]
    wrong = [f"{p.relative_to(ROOT)}:{line} uses {name}" for p in files for line, name in private_uses(p, names)]
    assert not wrong, "a scheduler's underscore members used outside core/scheduler:\n" + "\n".join(wrong)


def test_the_walk_sees_a_schedulers_underscore_member(tmp_path):
    """The check itself: a private method called and a private attribute written are both found."""
    source = tmp_path / "probe.py"
    source.write_text("def f(core):\n    core.scheduler._run_loop(False)\n    core.scheduler._scheduled = 0\n"
                      "class Mine:\n    def g(self):\n        self._scheduled = 1\n"
                      "class Follower(Scheduler):\n    def h(self):\n        return self._scheduled\n")
    assert sorted(private_uses(source, {"_run_loop", "_scheduled"})) == \
        [(2, "_run_loop"), (3, "_scheduled"), (9, "_scheduled")]
