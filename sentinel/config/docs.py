"""Render a configuration struct as Markdown, so docs/configuration.md is generated from the code itself
and cannot drift from it (a test compares the two)."""

from __future__ import annotations

from typing import Any

import msgspec

from sentinel.config.loader import env_name


def _type_name(info: Any) -> tuple[str, str]:
    """(type, constraint) for one leaf."""
    if isinstance(info, msgspec.inspect.Metadata):
        kind = (info.extra or {}).get("names")
        if kind is not None:
            from sentinel.components import registry  # the names a list of collectors/detectors accepts

            known = registry.COLLECTORS if kind == "collectors" else registry.DETECTORS
            return "one of " + ", ".join(f"`{name}`" for name in known), ""
        return _type_name(info.type)
    names = {
        msgspec.inspect.IntType: "integer",
        msgspec.inspect.FloatType: "float",
        msgspec.inspect.StrType: "string",
        msgspec.inspect.BoolType: "boolean",
    }
    for kind, name in names.items():
        if isinstance(info, kind):
            bounds = []
            for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                value = getattr(info, attr, None)
                if value is not None:
                    bounds.append(f"{sym} {value}")
            return name, ", ".join(bounds)
    if isinstance(info, msgspec.inspect.ListType):
        return f"list of {_type_name(info.item_type)[0]}", ""
    if isinstance(info, msgspec.inspect.LiteralType):
        return "one of " + ", ".join(f"`{v}`" for v in info.values), ""
    if isinstance(info, msgspec.inspect.UnionType):
        return " or ".join(_type_name(t)[0] for t in info.types), ""
    if isinstance(info, msgspec.inspect.NoneType):
        return "none", ""
    if isinstance(info, msgspec.inspect.DictType):
        return "table", ""
    return type(info).__name__, ""


def _description(info: Any) -> str:
    if isinstance(info, msgspec.inspect.Metadata) and info.extra_json_schema:
        return str(info.extra_json_schema.get("description", ""))
    return ""


def _default(field: msgspec.inspect.Field) -> str:
    if field.default is not msgspec.NODEFAULT:
        return f"`{msgspec.json.encode(field.default).decode()}`"
    if field.default_factory is not msgspec.NODEFAULT:
        return f"`{msgspec.json.encode(field.default_factory()).decode()}`"
    return "required"


def render_markdown(cls: type[msgspec.Struct], title: str, env_prefix: str) -> str:
    """One table per TOML section of ``cls``."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    lines = [f"## {title}", ""]
    top = [f for f in info.fields if not isinstance(f.type, msgspec.inspect.StructType)]
    sections = [f for f in info.fields if isinstance(f.type, msgspec.inspect.StructType)]
    if top:
        lines += _table(top, (), env_prefix)
    for section in sections:
        lines += _section(section, (section.encode_name,), env_prefix)
    return "\n".join(lines)


def _section(section: msgspec.inspect.Field, path: tuple[str, ...], env_prefix: str) -> list[str]:
    """One ``[a.b]`` table: its plain keys, then each nested struct as a section of its own."""
    assert isinstance(section.type, msgspec.inspect.StructType)
    doc = (section.type.cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    lines = [f"### `[{'.'.join(path)}]`", ""]
    if doc:
        lines += [doc, ""]
    fields = list(section.type.fields)
    plain = [f for f in fields if not isinstance(f.type, msgspec.inspect.StructType)]
    nested = [f for f in fields if isinstance(f.type, msgspec.inspect.StructType)]
    if plain:
        lines += _table(plain, path, env_prefix)
    for sub in nested:
        lines += _section(sub, (*path, sub.encode_name), env_prefix)
    return lines


def _table(fields: list[msgspec.inspect.Field], path: tuple[str, ...], env_prefix: str) -> list[str]:
    rows = ["| key | type | default | environment | meaning |", "|---|---|---|---|---|"]
    for field in fields:
        kind, bounds = _type_name(field.type)
        kind = f"{kind} ({bounds})" if bounds else kind
        env = env_name(env_prefix, (*path, field.encode_name))
        rows.append(
            f"| `{field.encode_name}` | {kind} | {_default(field)} | `{env}` | {_description(field.type)} |"
        )
    return [*rows, ""]
