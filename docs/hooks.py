"""MkDocs hooks (``hooks:`` in mkdocs.yml): the generated parts of the site.

A page asks for generated Markdown with a line ``<!-- gen: NAME -->``; what :data:`GENERATORS`
makes of the code and data today follows it in the committed page, up to ``<!-- end gen -->``,
so the page reads whole on GitHub too. :func:`on_page_markdown` puts in a fresh copy when the
site is built (an unknown name is an error, so ``mkdocs build --strict`` fails on a typo), and
``python docs/hooks.py`` rewrites the committed copies (``tests/test_docs_site.py`` fails while
one is stale). The API reference is one generated page per
package (``reference/api/<package>.md``, :func:`gen_reference.api_pages`), added to the files by
:func:`on_files` and under the nav's ``reference/api.md`` entry by :func:`on_config`, so a module
that moves or appears is documented where it now lives without touching mkdocs.yml.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (run as a script: its siblings)

import gen_reference  # noqa: E402
import gen_validation  # noqa: E402
from mkdocs.exceptions import PluginError  # noqa: E402
from mkdocs.structure.files import File  # noqa: E402

END = "<!-- end gen -->"
# the marker line, then the committed copy of the generated block (if any) up to END
MARKER = re.compile(r"^<!-- gen: ([\w.-]+) -->[ \t]*\n(?:(?:(?!<!-- gen: ).*\n)*?"
                    + re.escape(END) + r"[ \t]*$)?", re.M)
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


def expand(markdown: str, where: str = "", keep_markers: bool = False) -> str:
    """``markdown`` with each ``<!-- gen: NAME -->`` block (the marker line and any committed
    copy after it) replaced by its generated Markdown; ``keep_markers``: as the committed page
    holds it, between the marker line and ``<!-- end gen -->``."""
    def replace(match):
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(f"{where}: unknown generated block {name!r}; known: "
                              f"{sorted(GENERATORS)}")
        text = GENERATORS[name]().rstrip("\n")
        return f"<!-- gen: {name} -->\n{text}\n{END}" if keep_markers else text
    return MARKER.sub(replace, markdown)


def _fresh(root=None) -> dict:
    """``{page: its text with fresh generated blocks}`` for every page whose committed blocks
    differ from what the code makes today (each page read and expanded once)."""
    root = root or Path(__file__).resolve().parent
    out = {}
    for page in sorted(root.rglob("*.md")):
        text = page.read_text()
        fresh = expand(text, str(page), keep_markers=True)
        if fresh != text:
            out[page] = fresh
    return out


def stale_pages(root=None) -> list:
    """The committed pages whose generated blocks differ from what the code makes today."""
    return list(_fresh(root))


def write_pages(root=None) -> list:
    """Rewrite every stale page's generated blocks; returns the pages written."""
    fresh = _fresh(root)
    for page, text in fresh.items():
        page.write_text(text)
    return list(fresh)


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


if __name__ == "__main__":
    for page in write_pages():
        print(f"wrote {page}")
