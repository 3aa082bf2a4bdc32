"""The options table of docs/configuration.md, made from the settings (`Settings`), so that it cannot drift.

`python -m gateway.platform.config_docs` prints the table (flag, environment variable, default, meaning);
`python -m gateway.platform.config_docs --write docs/configuration.md` puts it between the file's
`<!-- options:begin -->` and `<!-- options:end -->` markers. tests/unit/test_config_docs.py holds the doc to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.platform.config import Settings

BEGIN = "<!-- options:begin -->"
END = "<!-- options:end -->"
HEADER = "| flag | environment | default | meaning |\n| --- | --- | --- | --- |"
MIB = 1024 * 1024


def flag(name: str) -> str:
    """A field's command-line flag, as `cli_kebab_case` spells it: `llm_model` -> `--llm-model`."""
    return "--" + name.replace("_", "-")


def is_switch(field: FieldInfo) -> bool:
    """A boolean: `cli_implicit_flags` makes it `--x` / `--no-x`."""
    return field.annotation is bool


def flags(settings: type[Settings] = Settings) -> set[str]:
    """Every flag `gateway serve` takes for these settings, `--no-x` of each switch included."""
    names: set[str] = set()
    for name, field in settings.model_fields.items():
        names.add(flag(name))
        if is_switch(field):
            names.add("--no-" + flag(name)[2:])
    return names


def environment_variable(name: str) -> str:
    return f"{Settings.model_config.get('env_prefix', '')}{name}".upper()


def _value(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple, set, dict)) and not value:
        return "none"
    if isinstance(value, Path):
        home = str(Path.home())
        text = str(value)
        return f"`~{text[len(home):]}`" if text.startswith(home + "/") else f"`{text}`"
    if isinstance(value, str):
        return f"`{value}`" if value else "empty"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, int) and value >= MIB and value % MIB == 0:
        return f"`{value}` ({value // MIB} MiB)"
    return f"`{value}`"


def default(field: FieldInfo) -> str:
    """A field's default as the table shows it; a factory that gives another value each call is `random`."""
    factory = field.default_factory
    if field.default is PydanticUndefined and factory is not None:
        first, second = factory(), factory()  # type: ignore[call-arg]  # the settings' factories take no data
        return "random" if first != second else _value(first)
    return _value(field.default)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def rows(settings: type[Settings] = Settings) -> list[str]:
    lines = []
    for name, field in settings.model_fields.items():
        shown = f"`{flag(name)}`" + (f" / `--no-{flag(name)[2:]}`" if is_switch(field) else "")
        lines.append(f"| {shown} | `{environment_variable(name)}` | {_cell(default(field))} | "
                     f"{_cell(field.description or '')} |")
    return lines


def table(settings: type[Settings] = Settings) -> str:
    """The Markdown table, one row per option in the settings' order."""
    return "\n".join([HEADER, *rows(settings)])


def documented_table(markdown: str) -> str:
    """What a document holds between the markers (stripped); ValueError when they are missing."""
    start, end = markdown.find(BEGIN), markdown.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} ... {END} section")
    return markdown[start + len(BEGIN):end].strip()


def write(path: Path) -> None:
    """Replace the table between the markers of `path` with the generated one."""
    markdown = path.read_text(encoding="utf-8")
    documented_table(markdown)  # the markers must be there already
    start, end = markdown.find(BEGIN) + len(BEGIN), markdown.find(END)
    path.write_text(f"{markdown[:start]}\n{table()}\n{markdown[end:]}", encoding="utf-8")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"] and len(argv) == 2:
        write(Path(argv[1]))
        return 0
    if argv:
        print("usage: python -m gateway.platform.config_docs [--write docs/configuration.md]", file=sys.stderr)
        return 2
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
