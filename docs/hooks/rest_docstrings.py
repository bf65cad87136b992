"""griffe extension: render our reST-flavoured docstrings as Markdown in the API reference.

The docstrings use Sphinx roles (``:class:`~ldp_beam.core.Mechanism```, ``:func:`.publish```) and
reST literal blocks (a paragraph ending in ``::``). mkdocstrings reads docstrings as Markdown,
which would print the roles as text (":class:") and keep the double colon. This extension
rewrites the docstrings as they are loaded (the code is not touched): a role becomes inline code
of its target (``~`` and leading dots keep the last name, as Sphinx shows it), and ``::`` ending
a paragraph becomes ``:`` (the indented block after it is a Markdown code block already).
"""
from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const|ref|doc|term):"
                  r"`([^`]+)`")
LITERAL = re.compile(r"(\S)::\n(\s*\n)", re.M)


def _target(m: re.Match) -> str:
    text = m.group(1).strip()
    short = text.startswith("~") or text.startswith(".")
    text = text.lstrip("~").lstrip(".")
    if short:
        text = text.rsplit(".", 1)[-1]
    return f"`{text}`"


def rewrite(doc: str) -> str:
    return LITERAL.sub(r"\1:\n\2", ROLE.sub(_target, doc))


class RestDocstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:  # griffe >= 1.0
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
