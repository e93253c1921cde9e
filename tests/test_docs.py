"""The docs site's sources hold together: what the README links to exists, mkdocs.yml's nav lists every page, the
API reference names every public name of the client, and the flag pages name every flag.

The site itself is built by ``make docs`` (``mkdocs build --strict``, which also checks links between pages and
their anchors), not here: these checks read files only."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import trionsq
import trionsq.blocking
from admin.options import Options as AdminOptions
from lookupd.options import Options as LookupdOptions
from nsqd.options import Options as NsqdOptions

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(path.name for path in DOCS.glob("*.md"))

# [text](target) outside code spans and fences is all a Markdown link here needs
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(path: Path) -> str:
    """The file's text without fenced code blocks and code spans (links inside them are not links)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _relative_links(path: Path) -> list[str]:
    return [target for target in _LINK.findall(_prose(path)) if not re.match(r"[a-z]+:", target)]


def test_the_docs_have_pages():
    assert {"index.md", "quickstart.md", "nsqd.md", "client.md", "api.md"} <= set(PAGES)


def test_every_page_the_readme_links_to_exists():
    targets = _relative_links(ROOT / "README.md")
    assert any(target.startswith("docs/") for target in targets)
    for target in targets:
        assert (ROOT / target.partition("#")[0]).is_file(), f"README.md links to {target}, which is missing"
    linked = {target.partition("#")[0] for target in targets}
    for page in PAGES:
        # a page that only includes a file of the repository (the changelog) is linked as that file
        included = re.fullmatch(r'--8<-- "([^"]+)"', (DOCS / page).read_text().strip())
        target = included.group(1) if included else f"docs/{page}"
        assert target in linked, f"README.md does not link to {target}"


def test_the_readme_shows_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    assert re.search(r"^make run\b", text, re.M) and re.search(r"^make test\b", text, re.M)


def test_the_nav_lists_every_page_and_only_pages_that_exist():
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config[config.index("\nnav:") :]
    listed = re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.M)
    assert sorted(listed) == PAGES, "mkdocs.yml's nav and docs/*.md differ"


def _public_names(module) -> set[str]:
    names = getattr(module, "__all__", None) or [name for name in dir(module) if not name.startswith("_")]
    return {name for name in names if not inspect.ismodule(getattr(module, name))}


@pytest.mark.parametrize("module", [trionsq, trionsq.blocking], ids=lambda module: module.__name__)
def test_the_api_reference_names_every_public_name(module):
    documented = set(re.findall(r"^::: ([\w.]+)\s*$", (DOCS / "api.md").read_text(), re.M))
    for name in _public_names(module):
        obj = getattr(module, name)
        # a name trionsq.blocking shares with trionsq is the same object, documented once under trionsq
        if module is trionsq.blocking and getattr(trionsq, name, None) is obj:
            continue
        assert f"{module.__name__}.{name}" in documented, f"docs/api.md has no '::: {module.__name__}.{name}'"


@pytest.mark.parametrize(
    ("options", "page"),
    [(NsqdOptions, "nsqd.md"), (LookupdOptions, "nsqd.md"), (AdminOptions, "nsqadmin.md")],
    ids=["nsqd", "nsqlookupd", "nsqadmin"],
)
def test_every_flag_is_on_its_page(options, page):
    text = (DOCS / page).read_text()
    for flag in options.flagset(None).flags:
        assert f"`--{flag.name}`" in text, f"docs/{page} does not name --{flag.name}"
