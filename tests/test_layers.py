"""The package's layer order, read from the syntax tree of every module (imports inside functions
included): no import goes up the order, no import cycle, no module imports another's private name,
and every module and function stays small enough to hold in one's head."""

import ast
from collections import defaultdict
from pathlib import Path

import autolade

ROOT = Path(autolade.__file__).parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100

# Lowest first. A module may import its own layer and the layers below it, never one above.
LAYERS = (
    ("base", ("autolade.errors", "autolade.config", "autolade.paths", "autolade.workloads")),
    ("engine", ("autolade.engine",)),
    ("records", ("autolade.records",)),
    ("machine", ("autolade.machine",)),
    ("store", ("autolade.store",)),
    ("runtime", ("autolade.runtime",)),
    ("api", ("autolade.api", "autolade.hf", "autolade")),  # autolade/__init__.py: the public surface
    ("tuning", ("autolade.tuning",)),
    ("bench", ("autolade.bench",)),
    ("serve", ("autolade.serve",)),  # the HTTP server: over api, beside bench
    ("cli", ("autolade.cli", "autolade.__main__")),
)
# the engine is the core: besides itself it sees only the config and the errors
ENGINE_MAY_IMPORT = ("autolade.engine", "autolade.config", "autolade.errors")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def layer_of(module: str) -> int:
    """Index in LAYERS of the longest matching prefix."""
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank is not None, f"{module} is in no layer: add it to LAYERS"
    return rank


def imports(path: Path, known: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every autolade import in ``path``, relative ones resolved."""
    me = module_name(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "autolade"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "autolade":
                continue
            for alias in node.names:  # `from autolade.x import y`: y may be a module itself
                sub = f"{module}.{alias.name}"
                out.append((sub, "", node.lineno) if sub in known else (module, alias.name, node.lineno))
    return out


def graph() -> dict[str, list[tuple[str, str, int]]]:
    known = modules()
    return {name: imports(path, known) for name, path in known.items()}


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)


def test_no_import_goes_up_the_layer_order():
    up = [f"{me} ({LAYERS[layer_of(me)][0]}) line {line} imports {target} ({LAYERS[layer_of(target)][0]})"
          for me, found in graph().items() for target, _, line in found if layer_of(target) > layer_of(me)]
    assert up == []


def test_engine_imports_only_itself_config_and_errors():
    bad = [f"{me}: {target}" for me, found in graph().items() if me.startswith("autolade.engine")
           for target, _, _ in found if not any(target == a or target.startswith(a + ".") for a in ENGINE_MAY_IMPORT)]
    assert bad == []


def test_no_private_name_crosses_a_module():
    private = [f"{me} line {line}: {target}.{name}" for me, found in graph().items()
               for target, name, line in found if name.startswith("_") and target != me]
    assert private == []


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_modules():
    known = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for me, found in graph().items():
        for target, _, _ in found:
            # a package's __init__ re-exporting its own modules is not a cycle through them
            if target in known and target != me and not target.startswith(me + "."):
                edges[me].add(target)
    assert cycles(edges) == []


def test_modules_and_functions_stay_small():
    big = []
    for name, path in modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            big.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    big.append(f"{name}.{node.name}: {length} lines")
    assert big == []
