"""Expected tensor shapes from a model's config.json: a transposed or reshaped tensor is refused, not converted.

A renamed tensor keeps whatever shape it has, so a `[out, in]` weight stored `[in, out]`, or one reshaped
to another shape with the same number of elements, would be written into the rank files and only fail (or
silently compute garbage) when Megatron loads it. The mapping table of a native converter lists the shape of
every HF tensor as data (`shapes:` in `mappings/<Converter>.yaml`): each dim an arithmetic expression over
config.json fields and the table's own `dims`, e.g. `[ffn_dim, inner]` with `inner: num_attention_heads *
attention_head_dim`. Expressions are parsed with `ast` and only names, integers, `+ - * //`, `a[i]` and
`a or b` (the first of two spellings a config has: `vision.in_channels or vision.in_chans`) are accepted,
checked when the table loads. A tensor whose expected shape needs a field the config lacks is not checked.
No torch here: the planner (MCP server) runs the check in the dry run.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping as MappingType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mm_agent.errors import MMAgentError

Dim = int | str
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}
MAX_LISTED = 5


class _Unknown(Exception):
    """A name the config does not have (or has as something other than numbers)."""


class ShapeTable(BaseModel):
    """`shapes:` of a mapping table: derived sizes, then HF tensor name (`*` = layer index) -> dims."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dims: dict[str, Dim] = Field(
        default_factory=dict, description="named sizes, in order; each may use config fields and earlier ones"
    )
    tensors: dict[str, list[Dim]] = Field(min_length=1, description="HF name -> expected shape")

    @field_validator("dims")
    @classmethod
    def _dims_parse(cls, value: dict[str, Dim]) -> dict[str, Dim]:
        for name, expr in value.items():
            if not name.isidentifier():
                raise ValueError(f"dim name {name!r} is not an identifier")
            _check(expr)
        return value

    @field_validator("tensors")
    @classmethod
    def _tensors_parse(cls, value: dict[str, list[Dim]]) -> dict[str, list[Dim]]:
        for name, dims in value.items():
            if name.count("*") > 1:
                raise ValueError(f"{name}: at most one `*` (the layer index)")
            for expr in dims:
                _check(expr)
        return value


def _check(expr: Dim) -> None:
    """Raise ValueError unless `expr` is an int or an expression this module evaluates."""
    if isinstance(expr, int):
        return
    _parse(expr)


@functools.cache
def _parse(expr: str) -> ast.expr:
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"shape expression {expr!r} does not parse: {exc.msg}") from exc
    for node in ast.walk(tree):
        allowed = (
            ast.BinOp,
            ast.BoolOp,
            ast.Or,
            ast.Name,
            ast.Attribute,
            ast.Subscript,
            ast.Load,
            ast.Constant,
        )
        if not isinstance(node, (*allowed, *_OPS, ast.FloorDiv)):
            raise ValueError(f"shape expression {expr!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Constant) and (
            isinstance(node.value, bool) or not isinstance(node.value, int)
        ):
            raise ValueError(f"shape expression {expr!r}: only integer constants")
    return tree


def _name(node: ast.expr) -> str | None:
    """`text.hidden_size` (an Attribute chain over a Name) as the dotted name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base is not None else None
    return None


def _eval(node: ast.expr, values: MappingType[str, Any]) -> Any:
    name = _name(node)
    if name is not None:
        value = values.get(name)
        if value is None or isinstance(value, bool):
            raise _Unknown(name)
        return value
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BoolOp):  # `a or b`: the first one the config has
        for part in node.values:
            try:
                return _eval(part, values)
            except _Unknown:
                continue
        raise _Unknown(ast.unparse(node))
    if isinstance(node, ast.Subscript):
        seq, index = _eval(node.value, values), _eval(node.slice, values)
        if not isinstance(seq, list) or not isinstance(index, int) or not -len(seq) <= index < len(seq):
            raise _Unknown(ast.unparse(node))
        return seq[index]
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, values), _eval(node.right, values)
        if not (isinstance(left, int) and isinstance(right, int)) or isinstance(left, bool):
            raise _Unknown(ast.unparse(node))
        if isinstance(node.op, ast.FloorDiv):
            if right == 0:
                raise _Unknown(ast.unparse(node))
            return left // right
        return _OPS[type(node.op)](left, right)
    raise _Unknown(ast.unparse(node))  # (refused by _parse already)


def _value(expr: Dim, values: MappingType[str, Any]) -> int:
    if isinstance(expr, int):
        return expr
    result = _eval(_parse(expr), values)
    if not isinstance(result, int) or isinstance(result, bool):
        raise _Unknown(expr)
    return result


def _namespace(table: ShapeTable, config: MappingType[str, Any]) -> dict[str, Any]:
    """The config's values plus the table's dims (a dim the config cannot give is left out)."""
    values = dict(config)
    for name, expr in table.dims.items():
        try:
            values[name] = _value(expr, values)
        except _Unknown:
            values.pop(name, None)
    return values


def _entry(table: ShapeTable, name: str) -> list[Dim] | None:
    """The table's shape for an HF tensor name (exact, or a `*` entry matching the layer index)."""
    exact = table.tensors.get(name)
    if exact is not None:
        return exact
    for key, dims in table.tensors.items():
        head, star, tail = key.partition("*")
        if (
            star
            and name.startswith(head)
            and name.endswith(tail)
            and name[len(head) : len(name) - len(tail)].isdigit()
        ):
            return dims
    return None


def expected_shapes(
    table: ShapeTable, names: list[str], config: MappingType[str, Any]
) -> dict[str, tuple[int, ...]]:
    """The expected shape of each name the table knows and the config gives every dim of."""
    values = _namespace(table, config)
    out: dict[str, tuple[int, ...]] = {}
    for name in names:
        dims = _entry(table, name)
        if dims is None:
            continue
        try:
            out[name] = tuple(_value(d, values) for d in dims)
        except _Unknown:
            continue
    return out


def check_shapes(
    table: ShapeTable | None,
    found: dict[str, tuple[int, ...]],
    config: MappingType[str, Any] | None,
    files: dict[str, str],
    shown: dict[str, str] | None = None,
) -> None:
    """Refuse tensors whose shape is not the one config.json implies. `found`: table name -> shape in the
    file; `files`: table name -> the file holding it; `shown`: table name -> the name in the file."""
    if table is None or config is None:
        return
    expected = expected_shapes(table, list(found), config)
    wrong = [(n, want, found[n]) for n, want in expected.items() if tuple(found[n]) != want]
    if not wrong:
        return
    label = shown or {}
    listed = "; ".join(
        f"{label.get(n, n)}: config.json implies {list(want)}, the file holds {list(have)}"
        for n, want, have in wrong[:MAX_LISTED]
    )
    more = f" (and {len(wrong) - MAX_LISTED} more)" if len(wrong) > MAX_LISTED else ""
    raise MMAgentError(
        f"{len(wrong)} tensor(s) do not have the shape config.json implies: {listed}{more}",
        file=files.get(wrong[0][0]),
        field="source",
        fix="the weights do not match their config.json: a transposed or reshaped export, a tensor edited by "
        "hand, or a config.json of another model size; re-download or re-export the checkpoint with its own "
        "config.json (transpose a [in, out] weight back to [out, in] if an exporter wrote it so)",
    )
