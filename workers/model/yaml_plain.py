"""Read a CosyVoice (HyperPyYAML) config as plain data, never constructing anything.

Upstream's yaml instantiates classes through tags (`!new:`, `!name:`, `!apply:`) and links
values with `!ref <key>` (optionally with arithmetic, e.g. `!ref <a> * <b>`). We only need the
hyperparameters, so tags become dictionaries with a `_target` entry, and references are
resolved to the values they point at. Nothing named in the file is imported or called.
"""

from __future__ import annotations

import ast
import operator
import re
from pathlib import Path
from typing import Any

import yaml

from shared.errors import ModelLoadError

TARGET_KEY = "_target"
_REF_PATTERN = re.compile(r"<([^<>]+)>")
_BINARY_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}


class _Ref:
    """A `!ref` expression waiting to be resolved against the whole document."""

    def __init__(self, expression: str) -> None:
        self.expression = expression


class _PlainLoader(yaml.SafeLoader):
    """SafeLoader that turns every custom tag into plain data."""


def _construct_tagged(loader: _PlainLoader, suffix: str, node: yaml.Node) -> Any:
    if suffix == "ref":
        if not isinstance(node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, "!ref takes a scalar", node.start_mark
            )
        return _Ref(str(loader.construct_scalar(node)))
    target = suffix.split(":", 1)[1] if ":" in suffix else suffix
    if isinstance(node, yaml.MappingNode):
        data = loader.construct_mapping(node, deep=True)
        return {TARGET_KEY: target, **data}
    if isinstance(node, yaml.SequenceNode):
        return {TARGET_KEY: target, "args": loader.construct_sequence(node, deep=True)}
    value = loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None
    return {TARGET_KEY: target} if value in ("", None) else {TARGET_KEY: target, "value": value}


_PlainLoader.add_multi_constructor("!", _construct_tagged)


def _lookup(document: dict[str, Any], path: str) -> Any:
    node: Any = document
    for part in re.split(r"[.\[\]]+", path.strip()):
        if not part:
            continue
        if not isinstance(node, dict) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def _evaluate(expression: str) -> Any:
    def visit(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return visit(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            return _BINARY_OPS[type(node.op)](visit(node.left), visit(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -visit(node.operand)
        raise ValueError(f"unsupported expression {expression!r}")

    return visit(ast.parse(expression, mode="eval"))


def _resolve(value: Any, document: dict[str, Any], depth: int = 0) -> Any:
    if depth > 32:
        raise ValueError("reference cycle")
    if isinstance(value, _Ref):
        whole = _REF_PATTERN.fullmatch(value.expression.strip())
        if whole:  # a plain reference may point at any value, mappings included
            return _resolve(_lookup(document, whole.group(1)), document, depth + 1)
        text = _REF_PATTERN.sub(
            lambda m: repr(_resolve(_lookup(document, m.group(1)), document, depth + 1)),
            value.expression,
        )
        return _evaluate(text)
    if isinstance(value, dict):
        return {k: _resolve(v, document, depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, document, depth) for v in value]
    return value


def load_plain_yaml(path: Path) -> dict[str, Any]:
    """Parse `path` into plain dicts/lists/scalars with `!ref`s resolved."""
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=_PlainLoader)
    except (OSError, yaml.YAMLError) as e:
        raise ModelLoadError(f"{path}: cannot be read as YAML ({e})") from e
    if not isinstance(document, dict):
        raise ModelLoadError(f"{path}: expected a mapping at the top level")
    try:
        resolved = _resolve(document, document)
    except (KeyError, ValueError, SyntaxError) as e:
        raise ModelLoadError(f"{path}: unresolvable !ref ({e})") from e
    return resolved
