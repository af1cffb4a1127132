"""PyYAML's tag and value of a scalar, shared by the full loader and the direct reader."""

from __future__ import annotations

import functools
from typing import Any

import yaml

STR, INT = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int"
PLAIN_IMPLICIT = (True, False)  # what PyYAML's composer passes for an unquoted scalar
MEMO_CHARS = 64  # scalars up to this length have their implicit tag memoized

_PLAIN_SCALARS = {tag: yaml.constructor.SafeConstructor.yaml_constructors[tag]
                  for tag in (f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float"))}
_CONSTRUCTOR = yaml.constructor.SafeConstructor()  # stateless for the plain scalar types


@functools.lru_cache(maxsize=4096)
def scalar_tag(value: str, implicit: tuple[bool, bool] = PLAIN_IMPLICIT) -> str:
    """PyYAML's resolver: a pure function of (value, implicit), as no path resolvers are registered."""
    return yaml.resolver.Resolver().resolve(yaml.ScalarNode, value, implicit)


def scalar_value(tag: str, text: str, node: yaml.ScalarNode | None = None,
                 constructor: yaml.constructor.SafeConstructor = _CONSTRUCTOR) -> Any:
    """PyYAML's value of a scalar with ``tag`` (raises ``ValueError`` or ``YAMLError`` where it fails).

    Without a ``node`` (the direct reader) only str, int, float, bool and null are built; other tags
    (timestamps, binary) raise ``ValueError``.
    """
    if tag == STR:
        return text
    if tag == INT and text.isascii() and text.isdigit() and text[0] != "0":  # YAML 1.1: 0-led is octal
        return int(text)
    plain = _PLAIN_SCALARS.get(tag)  # the function construct_object would call, minus its bookkeeping
    if plain is not None:
        return plain(constructor, node if node is not None else yaml.ScalarNode(tag, text))
    if node is None:
        raise ValueError(f"{tag} is left to the full loader")
    return constructor.construct_object(node)
