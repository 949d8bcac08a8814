"""Values in Hydra's command-line override syntax (hydra/grammar/OverrideLexer.g4, OverrideParser.g4): what
verl's launch scripts write and what autotune's exported commands write."""

from __future__ import annotations

import re

# Strings Hydra would read back as another type, or that need quotes in its override grammar.
_NOT_A_STRING = re.compile(r"(?i)null|true|false|[-+]?(\d[\d_]*(\.\d*)?|\.\d+)(e[-+]?\d+)?|[-+]?(inf|nan)")
_BARE_STRING = re.compile(r"(?:[\w/\-+.%*@?|:]|\$\{[^{}'\"]*\})+")  # OverrideLexer.g4 UNQUOTED_CHAR


def hydra_value(value) -> str:
    """A YAML value in Hydra's command-line override syntax."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _BARE_STRING.fullmatch(text) and not _NOT_A_STRING.fullmatch(text):
        return text
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    return "'" + text.replace("'", "\\'") + "'"
