"""`config.yml` read strictly: a YAML error names the file and the line, and a key written twice
in one mapping is refused (YAML's loaders keep the last one silently, so an edit lower in the
file would undo one above without a word). Keys that a merge (`<<: *anchor`) brings in may be
overridden: that is what merging is for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway.config.base import ConfigError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"{self.name}: line {line}: {key} is written twice in this mapping (first on line "
                    f"{seen[key]}): keep one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(file: Path) -> Any:
    """The file's YAML document (None when empty), or a one-line ConfigError naming the file and
    the line of the problem."""
    loader = _StrictLoader(file.read_text(encoding="utf-8"))
    loader.name = str(file)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(_where(file, exc)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
    finally:
        loader.dispose()


def _where(file: Path, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = exc.problem or "not valid YAML"
    context = f" ({exc.context})" if exc.context else ""
    return f"{file}: {where}not valid YAML: {problem}{context}"
