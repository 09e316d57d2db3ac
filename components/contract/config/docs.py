"""The config reference: every key with its type, default and comment (docs/configuration)."""
from __future__ import annotations

import dataclasses
from typing import Any

from components.contract.config.sections import SECTIONS, PipelineConfig, _field_types, to_dict


def describe_fields() -> list[tuple[str, str, Any, str]]:
    """(key, type, default, comment) for every field, for the config reference."""
    import inspect
    import re
    rows = []
    for section in SECTIONS:
        cls = _field_types(PipelineConfig)[section]
        # The help is the field's declared `help`, else its source line's comment.
        comments = {f.name: f.metadata["help"] for f in dataclasses.fields(cls)
                    if "help" in f.metadata}
        if len(comments) < len(dataclasses.fields(cls)):
            for line in inspect.getsource(cls).splitlines():
                m = re.match(r"\s+(\w+):[^#]*#\s*(.*)$", line)
                if m:
                    comments.setdefault(m.group(1), m.group(2).strip())
        default = cls()
        for f in dataclasses.fields(cls):
            typ = _field_types(cls)[f.name]
            tname = getattr(typ, "__name__", None) or str(typ).replace("typing.", "")
            rows.append((f"{section}.{f.name}", tname, to_dict(getattr(default, f.name)),
                         comments.get(f.name, "")))
    return rows
