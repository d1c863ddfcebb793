"""``python -m oncebox_tool build``: the tool's directory to a component.

Reads ``[tool.oncebox]`` in the ``pyproject.toml`` of the current directory::

    [tool.oncebox]
    module = "app"                # the tool's module: app.py (or app/__init__.py)
    class = "compensatable"       # read-only | idempotent-write | compensatable | irreversible
    output = "charge_py.wasm"     # default: the project's name, dashes as underscores

writes a small entry module (the app module componentize-py wraps: it imports the tool's module
and defines the ``Tool``/``Reconcile`` export classes from the one ``oncebox_tool.Tool`` subclass
there) into a temporary directory, and runs componentize-py against the SDK's own copy of the
contract (``oncebox_tool/wit``) and the class's world.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._glue import CLASSES, normalize_class

SDK_DIR = Path(__file__).resolve().parent
WIT_DIR = SDK_DIR / "wit"
ENTRY_MODULE = "oncebox_entry"
# Top-level names the component already has; a tool module named like one would shadow it.
RESERVED = {"wit_world", "componentize_py_types", "componentize_py_runtime", "componentize_py_async_support",
            "poll_loop", "oncebox_tool", ENTRY_MODULE}

ENTRY = '''\
# Written by `python -m oncebox_tool build`: the app module componentize-py wraps. Not to be edited.
from oncebox_tool import _glue

_export = _glue.export({module!r}, {replay_class!r}, {version!r})


class Tool:
    def describe(self):
        return _export.describe()

    def invoke(self, args):
        return _export.invoke(args)
'''

ENTRY_RECONCILE = '''

class Reconcile:
    def reconcile(self, effect_key, args):
        return _export.reconcile(effect_key, args)
'''


class Failure(Exception):
    """A one-line error for the person building."""


def _toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise Failure(f"no pyproject.toml in {path.parent}: run `python -m oncebox_tool build` in the tool's directory") from None
    except tomllib.TOMLDecodeError as e:
        raise Failure(f"{path}: {e}") from None


def read_settings(directory: Path) -> dict:
    """The build's settings from ``directory/pyproject.toml``, checked."""
    pyproject = directory / "pyproject.toml"
    data = _toml(pyproject)
    table = data.get("tool", {}).get("oncebox")
    if not isinstance(table, dict):
        raise Failure(
            f"{pyproject} has no [tool.oncebox] table: add one with module = \"app\" and "
            f"class = \"{'|'.join(CLASSES)}\""
        )
    unknown = sorted(set(table) - {"module", "class", "output"})
    if unknown:
        raise Failure(f"{pyproject}: [tool.oncebox] has unknown keys {', '.join(unknown)} (known: module, class, output)")
    project = data.get("project", {}) if isinstance(data.get("project"), dict) else {}

    replay_class = table.get("class")
    if replay_class is None:
        raise Failure(f"{pyproject}: [tool.oncebox] has no class; set class = \"{'|'.join(CLASSES)}\"")
    if not isinstance(replay_class, str) or normalize_class(replay_class) not in CLASSES:
        raise Failure(f"{pyproject}: [tool.oncebox] class = {replay_class!r} is not one of {', '.join(CLASSES)}")
    replay_class = normalize_class(replay_class)

    module = table.get("module", "app")
    if not isinstance(module, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", module):
        raise Failure(f"{pyproject}: [tool.oncebox] module = {module!r} is not a Python module name")
    top = module.split(".")[0]
    if top in RESERVED or top in getattr(sys, "stdlib_module_names", ()):
        raise Failure(f"{pyproject}: [tool.oncebox] module = {module!r} shadows a module the component needs; rename it")
    relative = Path(*module.split("."))
    if not ((directory / relative).with_suffix(".py").is_file() or (directory / relative / "__init__.py").is_file()):
        raise Failure(
            f"{pyproject}: [tool.oncebox] module = {module!r}, but there is no {relative}.py "
            f"(nor {relative}/__init__.py) in {directory}"
        )

    name = project.get("name") if isinstance(project.get("name"), str) else top
    output = table.get("output") or f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}.wasm"
    if not isinstance(output, str):
        raise Failure(f"{pyproject}: [tool.oncebox] output = {output!r} is not a path")
    version = project.get("version") if isinstance(project.get("version"), str) else "0.1.0"
    return {
        "module": module,
        "class": replay_class,
        "world": CLASSES[replay_class][0],
        "reconciles": CLASSES[replay_class][2],
        "output": (directory / output).resolve(),
        "version": version,
    }


def _python_path(directory: Path, entry_dir: Path) -> list:
    """Where componentize-py looks for modules: the entry module, the tool's directory, this SDK,
    then this interpreter's site-packages (for the tool's own pure-Python dependencies)."""
    paths = [entry_dir, directory, SDK_DIR.parent]
    try:
        paths += [Path(p) for p in site.getsitepackages()]
    except AttributeError:  # pragma: no cover (old virtualenvs)
        pass
    seen, result = set(), []
    for p in paths:
        p = p.resolve()
        if p.is_dir() and p not in seen:
            seen.add(p)
            result.append(str(p))
    return result


def componentize_command(settings: dict, directory: Path, entry_dir: Path, stub_wasi: bool) -> list:
    command = [
        sys.executable,
        "-c",
        "import sys, componentize_py; sys.exit(componentize_py.script())",
        "--wit-path", str(WIT_DIR),
        "--world", settings["world"],
        "--quiet",
        "componentize", ENTRY_MODULE,
        "--output", str(settings["output"]),
    ]
    for p in _python_path(directory, entry_dir):
        command += ["--python-path", p]
    if stub_wasi:
        command.append("--stub-wasi")
    return command


def _explain(stderr: str, code: int) -> str:
    """One line for a check of the SDK's that failed while componentize-py imported the tool;
    otherwise componentize-py's own output (the tool's traceback, a WIT error), then a line."""
    match = re.search(r"^(?:oncebox_tool\._glue\.)?BuildError: (.+)$", stderr, re.MULTILINE)
    if match:
        return match.group(1)
    sys.stderr.write(stderr)
    return f"componentize-py failed (exit {code}); its output is above"


def build(directory: Path, stub_wasi: bool = False) -> Path:
    settings = read_settings(directory)
    try:
        import componentize_py  # noqa: F401
    except ImportError:
        raise Failure("componentize-py is not installed in this environment: pip install componentize-py==0.25.1") from None
    settings["output"].parent.mkdir(parents=True, exist_ok=True)
    entry_dir = Path(tempfile.mkdtemp(prefix="oncebox-build-"))
    try:
        entry = ENTRY.format(module=settings["module"], replay_class=settings["class"], version=settings["version"])
        if settings["reconciles"]:
            entry += ENTRY_RECONCILE
        (entry_dir / f"{ENTRY_MODULE}.py").write_text(entry, encoding="utf-8")
        started = time.monotonic()
        # No Rust backtrace of componentize-py itself: the Python traceback is what tells.
        env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")
        result = subprocess.run(
            componentize_command(settings, directory, entry_dir, stub_wasi),
            cwd=directory,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        if result.returncode != 0:
            raise Failure(_explain(result.stderr, result.returncode))
        sys.stderr.write(result.stderr)
        elapsed = time.monotonic() - started
    finally:
        shutil.rmtree(entry_dir, ignore_errors=True)
    output = settings["output"]
    size = output.stat().st_size / 1e6
    print(f"built {output} ({settings['class']}, world {settings['world']}, {size:.1f} MB, {elapsed:.1f}s)")
    return output


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oncebox_tool", description="Build oncebox tools written in Python.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    build_parser = commands.add_parser(
        "build", help="build the tool in the current directory (its pyproject.toml's [tool.oncebox]) to a component"
    )
    build_parser.add_argument("-C", "--directory", default=".", help="the tool's directory (default: the current one)")
    build_parser.add_argument(
        "--stub-wasi",
        action="store_true",
        help="replace WASI imports with trapping stubs (print and uncaught exceptions then trap without a message)",
    )
    commands.add_parser("wit", help="print the directory of the SDK's copy of the contract (WIT)")
    args = parser.parse_args(argv)
    if args.command == "wit":
        print(WIT_DIR)
        return 0
    if args.command != "build":
        parser.print_help()
        return 2
    try:
        build(Path(args.directory).resolve(), stub_wasi=args.stub_wasi)
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
