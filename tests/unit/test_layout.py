"""Layout of the packages, read statically with ``ast`` (no module is imported or run).

(a) The import graph of ``dplib`` and ``spark_jobs`` (top-level and function-level imports) has
    no cycle.
(b) ``pyspark`` and ``delta`` are imported only under ``spark_jobs/spark/`` (plus an allow-list).
(c) ``dplib`` imports nothing from ``spark_jobs``.
(d) Every import inside a function says why it is there: a comment containing "lazy" on its line
    or on the line above.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("dplib", "spark_jobs")
SPARK_DIR = "spark_jobs/spark/"
SPARK_MODULES = ("pyspark", "delta")

#: Modules outside spark_jobs/spark/ allowed to import pyspark or delta: none.
SPARK_IMPORT_ALLOWED: tuple[str, ...] = ()

#: Rule (d) covers every module of both packages.
LAZY_RULE_SKIPPED: tuple[str, ...] = ()
LAZY_RULE_CHECKED = ("dplib/", "spark_jobs/")


def _sources() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py file of the packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


SOURCES = _sources()


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _imports(path: pathlib.Path):
    """``(node, in_function, absolute names)`` for every import statement of a module file."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return _imports_in(path.read_text(), module.removesuffix(".__init__"), path.name == "__init__.py", str(path))


def _imports_in(source: str, module: str, is_package: bool, filename: str = "<source>"):
    """Every import statement of ``source`` (the text of ``module``): the node, whether it sits
    inside a function body, and the absolute dotted names it imports (for ``from X import a, b``:
    ``X``, ``X.a``, ``X.b``; relative imports resolved against ``module``)."""
    package = module if is_package else module.rpartition(".")[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.append((child, in_function, [a.name for a in child.names]))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                found.append((child, in_function, [base] + [f"{base}.{a.name}" for a in child.names]))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(source, filename=filename), False)
    return found


def _says_lazy(line: str, above: str) -> bool:
    """A comment containing "lazy" on the import's line, or a comment line above it."""
    return "lazy" in line.partition("#")[2] or (above.lstrip().startswith("#") and "lazy" in above)


def _target(name: str) -> str | None:
    """The module of the packages that an imported name resolves to (longest dotted prefix)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in SOURCES:
            return candidate
    return None


def _edges(imports, module: str) -> set[str]:
    """Modules of the packages that ``module``'s imports name. ``from pkg import submodule``
    counts as an edge to the submodule only (a package's ``__init__`` importing its own
    submodules is not a cycle)."""
    edges = set()
    for node, _, names in imports:
        targets = {_target(n) for n in names} - {None, module}
        if isinstance(node, ast.ImportFrom) and len(targets) > 1:
            targets.discard(_target(names[0]))
        edges |= targets
    return edges


def _graph() -> dict[str, set[str]]:
    return {module: _edges(_imports(path), module) for module, path in SOURCES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def strongconnect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return found


def test_the_rules_see_what_they_check():
    """The parser behind the rules, on a made-up module: function-level imports are edges too
    (else (a) would be blind to the circles they hide), relative imports resolve, the lazy
    comment is found on the line or the line above, and a cycle is found."""
    source = (
        "from .batches import OTHER\n"
        "from dplib.distribution import p3\n"
        "def f():\n"
        "    from dplib.distribution.private import STAGE_P3  # lazy: why\n"
        "    # lazy: why\n"
        "    import pyspark\n"
        "    import spark_jobs.spark.keys\n"
    )
    imports = _imports_in(source, "dplib.distribution.made_up", False)
    assert [(n.lineno, f) for n, f, _ in imports] == [(1, False), (2, False), (4, True), (6, True), (7, True)]
    assert _edges(imports, "dplib.distribution.made_up") == {
        "dplib.distribution.batches", "dplib.distribution.p3", "dplib.distribution.private", "spark_jobs.spark.keys",
    }
    lines = [""] + source.splitlines()
    assert [_says_lazy(lines[n.lineno], lines[n.lineno - 1]) for n, f, _ in imports if f] == [True, True, False]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert "dplib.distribution.p3" in _graph()["dplib.distribution.private"]


def test_import_graph_has_no_cycles():
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles (top-level and function-level imports): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_pyspark_and_delta_only_under_spark_jobs_spark():
    offenders = []
    for path in SOURCES.values():
        rel = _rel(path)
        if rel.startswith(SPARK_DIR) or rel in SPARK_IMPORT_ALLOWED:
            continue
        for node, _, names in _imports(path):
            top = names[0].split(".")[0]
            if top in SPARK_MODULES:
                offenders.append(f"{rel}:{node.lineno} imports {names[0]}")
    assert offenders == []


def test_dplib_imports_nothing_from_spark_jobs():
    offenders = [
        f"{_rel(path)}:{node.lineno} imports {names[0]}"
        for module, path in SOURCES.items()
        if module.split(".")[0] == "dplib"
        for node, _, names in _imports(path)
        if names[0].split(".")[0] == "spark_jobs"
    ]
    assert offenders == []


def _lazy_rule_applies(rel: str) -> bool:
    if rel.startswith(LAZY_RULE_CHECKED):
        return True
    assert rel.startswith(LAZY_RULE_SKIPPED), rel
    return False


def test_function_level_imports_say_why():
    offenders = []
    for path in SOURCES.values():
        rel = _rel(path)
        if not _lazy_rule_applies(rel):
            continue
        lines = [""] + path.read_text().splitlines()
        for node, in_function, _ in _imports(path):
            if in_function and not _says_lazy(lines[node.lineno], lines[node.lineno - 1]):
                offenders.append(f"{rel}:{node.lineno}: {lines[node.lineno].strip()}")
    assert offenders == [], "imports inside functions need a '# lazy: <why>' comment:\n" + "\n".join(offenders)
