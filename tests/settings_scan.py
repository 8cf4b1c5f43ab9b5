"""The KDIV_* settings the code reads, found by reading the code (no import, no environment).

Shared by the tests that hold other files to the code: docker/compose.yaml may set only these
names, and docs/settings.md lists exactly these, with the defaults the code gives them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "app" / "kdiv"

_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
# A whole name: "KDIV_TICDC_*" and "KDIV_SCHEMA_REGISTRY_*" in prose name families, not settings.
_KDIV_NAME = re.compile(r"KDIV_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_]*\*)")
# EnvReader methods whose default is a positional argument, and its index.
_DEFAULT_ARGUMENT = {"str": 1, "int": 1, "float": 1, "bool": 1, "choice": 2}


def _env_reader_methods(tree: ast.Module) -> set[str]:
    """Methods of settings' `EnvReader` (each takes a variable name without the KDIV_ prefix)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "EnvReader":
            return {f.name for f in node.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}
    return set()


def _loop_values(parents: dict, node: ast.AST, variable: str) -> list[str]:
    """String constants an enclosing `for variable in (...)` (statement or comprehension) binds."""
    while node in parents:
        node = parents[node]
        generators = (
            node.generators if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) else []
        )
        loops = [(g.target, g.iter) for g in generators]
        if isinstance(node, ast.For):
            loops.append((node.target, node.iter))
        for target, iterable in loops:
            if isinstance(target, ast.Name) and target.id == variable and isinstance(iterable, (ast.Tuple, ast.List)):
                return [e.value for e in iterable.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _names_of_argument(parents: dict, argument: ast.AST) -> list[str]:
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return [argument.value]
    if isinstance(argument, ast.JoinedStr):
        # f"SCHEMA_REGISTRY_{name}" inside `for name in ("CA", ...)`
        parts = argument.values
        if (
            len(parts) == 2
            and isinstance(parts[0], ast.Constant)
            and isinstance(parts[1], ast.FormattedValue)
            and isinstance(parts[1].value, ast.Name)
        ):
            return [str(parts[0].value) + v for v in _loop_values(parents, argument, parts[1].value.id)]
    return []


class _Unknown(Exception):
    """A default that is not a literal the scan can evaluate."""


def _class_attributes(parents: dict, node: ast.AST) -> dict[str, ast.expr]:
    """The annotated attributes (dataclass fields) of the class enclosing node."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.ClassDef):
            return {
                statement.target.id: statement.value
                for statement in node.body
                if isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and statement.value is not None
            }
    return {}


def _literal(node: ast.expr, attributes: dict[str, ast.expr]) -> object:
    """The value of a default written as a literal: constants, `cls.<field>` (its default),
    arithmetic on them, `Path(...)`, `str(...)` and `field(default=...)`."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cls":
        if node.attr not in attributes:
            raise _Unknown(node.attr)
        return _literal(attributes[node.attr], attributes)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand, attributes)  # type: ignore[operator]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.Add, ast.Sub)):
        left, right = _literal(node.left, attributes), _literal(node.right, attributes)
        operations = {ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
        operations |= {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b}
        return operations[type(node.op)](left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id in ("Path", "str") and len(node.args) == 1:
            return str(_literal(node.args[0], attributes))
        if node.func.id == "field":
            for keyword in node.keywords:
                if keyword.arg == "default":
                    return _literal(keyword.value, attributes)
    raise _Unknown(ast.dump(node))


def _scan() -> tuple[set[str], dict[str, object]]:
    trees = {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}
    readers = _env_reader_methods(trees[PACKAGE / "config" / "env.py"])
    assert {"str", "int", "bool"} <= readers, "config.env.EnvReader readers not found: the scan is out of date"
    names: set[str] = set()
    defaults: dict[str, object] = {}
    for tree in trees.values():
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(_KDIV_NAME.findall(node.value))
            if isinstance(node, ast.JoinedStr):
                # f"{PREFIX}TICDC_TOPIC_PATTERN ..." in a message names KDIV_TICDC_TOPIC_PATTERN
                for before, after in zip(node.values, node.values[1:], strict=False):
                    if (
                        isinstance(before, ast.FormattedValue)
                        and isinstance(before.value, ast.Name)
                        and before.value.id == "PREFIX"
                        and isinstance(after, ast.Constant)
                        and isinstance(after.value, str)
                    ):
                        names.update(_KDIV_NAME.findall("KDIV_" + after.value))
            if not isinstance(node, ast.Call):
                continue
            if (  # a helper given the reader and a name: _pattern(env, "TICDC_TOPIC_PATTERN")
                len(node.args) >= 2
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "env"
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _NAME.fullmatch(node.args[1].value)
            ):
                names.add("KDIV_" + node.args[1].value)
            if isinstance(node.func, ast.Attribute) and node.func.attr in readers and node.args:
                read = ["KDIV_" + n for n in _names_of_argument(parents, node.args[0]) if _NAME.fullmatch(n)]
                names.update(read)
                position = _DEFAULT_ARGUMENT.get(node.func.attr)
                if len(read) == 1 and position is not None and len(node.args) > position:
                    try:
                        defaults[read[0]] = _literal(node.args[position], _class_attributes(parents, node))
                    except _Unknown:
                        pass
            # click options: envvar="KDIV_X", default=<literal>
            keywords = {k.arg: k.value for k in node.keywords}
            envvar, default = keywords.get("envvar"), keywords.get("default")
            if isinstance(envvar, ast.Constant) and isinstance(envvar.value, str) and default is not None:
                try:
                    value = _literal(default, {})
                except _Unknown:
                    continue
                if value is not None:
                    defaults.setdefault(envvar.value, value)
    return names, defaults


def kdiv_variables_read_by_the_code() -> set[str]:
    """Every KDIV_* name app/ mentions: literal "KDIV_..." strings, and the names given to
    settings' `EnvReader` readers (``env.str("TOPICS", ...)`` reads KDIV_TOPICS)."""
    return _scan()[0]


def kdiv_literal_defaults() -> dict[str, object]:
    """The default the code gives each KDIV_* setting where it is written as a literal
    (``env.int("BATCH_MAX", cls.batch_max, ...)`` with ``batch_max: int = 100_000``)."""
    return _scan()[1]
