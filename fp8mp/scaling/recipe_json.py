"""Recipes as plain JSON values and back: ``{"type": "RowwiseScaling", "fields": {"power_of_2_scales": true,
"fp8_format": "E4M3"}}``.

Enums (Format) are written by value, nested dataclasses (MMParams) as objects of their fields. Reading takes any
recipe the registry knows (recipe_registry.QUANTIZERS), by its class name; a field left out takes its default, and
the recipe's own checks then run, so a bad value is refused naming the field.
"""
from __future__ import annotations

import dataclasses
import enum
import typing

from fp8mp.scaling.recipe_registry import QUANTIZERS, is_recipe

__all__ = ["recipe_to_dict", "recipe_from_dict"]


def _value_to_json(value):
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _value_to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def recipe_to_dict(recipe) -> dict:
    """`recipe` as {"type": its class name, "fields": {field: JSON value}}."""
    if not is_recipe(recipe):
        raise TypeError(f"argument 'recipe' must be an fp8mp recipe, got {type(recipe).__name__}")
    return {"type": type(recipe).__name__, "fields": _value_to_json(recipe)}


def _value_from_json(kind, value, where: str):
    """`value` (JSON) as an object of annotation `kind`: an Enum by value, a dataclass from its fields."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in kind)
            raise ValueError(f"{where} must be one of {allowed}, got {value!r}") from None
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _dataclass_from_json(kind, value, where)
    return value


def _dataclass_from_json(cls: type, fields, where: str):
    if not isinstance(fields, dict):
        raise ValueError(f"{where} must be an object of {cls.__name__}'s fields, got {fields!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise ValueError(f"{where}: {cls.__name__} has no field {unknown[0]!r}; its fields: {', '.join(names)}")
    values = {name: _value_from_json(hints[name], value, f"{where}.{name}") for name, value in fields.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


def recipe_from_dict(data, where: str = "recipe"):
    """The recipe `data` describes (what recipe_to_dict wrote); errors start with `where` (the value's place)."""
    if not isinstance(data, dict) or set(data) - {"type", "fields"} or "type" not in data:
        raise ValueError(f"{where} must be an object {{\"type\": recipe class name, \"fields\": {{...}}}}, got {data!r}")
    classes = {cls.__name__: cls for cls in QUANTIZERS}
    cls = classes.get(data["type"])
    if cls is None:
        raise ValueError(f"{where}.type must be one of {', '.join(classes)}, got {data['type']!r}")
    return _dataclass_from_json(cls, data.get("fields", {}), f"{where}.fields")
