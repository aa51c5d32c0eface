"""MkDocs hooks (``hooks:`` in mkdocs.yml): the generated parts of the site.

A page asks for generated Markdown with a line ``<!-- gen: NAME -->``; :func:`on_page_markdown`
replaces it with what :data:`GENERATORS` makes of the code and data today (an unknown name is an
error, so ``mkdocs build --strict`` fails on a typo). The API reference is one generated page per
package (``reference/api/<package>.md``, :func:`gen_reference.api_pages`), added to the files by
:func:`on_files` and under the nav's ``reference/api.md`` entry by :func:`on_config`, so a module
that moves or appears is documented where it now lives without touching mkdocs.yml.
"""

from __future__ import annotations

import re

import gen_reference
import gen_validation
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

MARKER = re.compile(r"^<!-- gen: ([\w.-]+) -->[ \t]*$", re.M)
API_INDEX = "reference/api.md"


def api_index() -> str:
    """The API index: each package's page and its docstring's first sentence."""
    first = {name: line for name, _, line in gen_reference.modules()}
    out = []
    for page in gen_reference.api_pages():
        package = page.removeprefix("reference/api/").removesuffix(".md")
        out.append(f"- [`{package}`](api/{package}.md) - {first.get(package, '')}")
    return "\n".join(out) + "\n"


GENERATORS = {
    "cli": gen_reference.cli_reference,
    "toml": gen_reference.toml_reference,
    "module-map": gen_reference.module_map,
    "layers": gen_reference.layer_table,
    "api-index": api_index,
    "models": gen_reference.models_table,
    "gpus": gen_reference.gpus_table,
    **{f"validation.{name}": make for name, make in gen_validation.TABLES.items()},
}


def expand(markdown: str, where: str = "") -> str:
    """``markdown`` with each ``<!-- gen: NAME -->`` line replaced by its generated Markdown."""
    def replace(match):
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(f"{where}: unknown generated block {name!r}; known: "
                              f"{sorted(GENERATORS)}")
        return GENERATORS[name]().rstrip("\n")
    return MARKER.sub(replace, markdown)


def _with_api_pages(nav, pages):
    """The nav with the API index's entry turned into a section: the index, then one entry per
    generated package page."""
    out = []
    for item in nav:
        if isinstance(item, dict):
            (title, value), = item.items()
            if value == API_INDEX:
                value = [API_INDEX] + [{page.removeprefix("reference/api/").removesuffix(".md"):
                                        page} for page in pages]
            elif isinstance(value, list):
                value = _with_api_pages(value, pages)
            item = {title: value}
        out.append(item)
    return out


def on_config(config):
    config["nav"] = _with_api_pages(config["nav"], list(gen_reference.api_pages()))
    return config


def on_files(files, config):
    for path, content in gen_reference.api_pages().items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    return expand(markdown, page.file.src_path)
