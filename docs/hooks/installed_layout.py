"""mkdocs hook: let mkdocstrings read the package as it is installed.

The repository keeps the Beam layer and the commands at the top level (``transforms/``,
``pipelines/``) and pyproject's ``[tool.setuptools.package-dir]`` installs them as
``ldp_beam.transforms`` and ``ldp_beam.pipelines``. mkdocstrings (griffe) reads source files
statically, so it would look for ``ldp_beam/transforms/`` and not find it. Before mkdocstrings
starts, this hook mirrors the installed layout in a temporary folder of symbolic links (nothing is
copied, nothing in the repository changes) and points the Python handler's search path at it.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import tomllib

from mkdocs.plugins import event_priority

_TREE: str | None = None


def _mirror(root: str) -> str:
    with open(os.path.join(root, "pyproject.toml"), "rb") as fh:
        mapping = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    tree = tempfile.mkdtemp(prefix="ldp-beam-api-")
    atexit.register(shutil.rmtree, tree, ignore_errors=True)
    # parents first, so that "ldp_beam" exists before "ldp_beam.transforms" is linked into it
    for name in sorted(mapping, key=lambda n: n.count(".")):
        src = os.path.join(root, mapping[name])
        dst = os.path.join(tree, *name.split("."))
        os.makedirs(dst, exist_ok=True)
        for entry in os.listdir(src):
            target = os.path.join(dst, entry)
            if entry == "__pycache__" or os.path.lexists(target):
                continue
            os.symlink(os.path.join(src, entry), target)
    return tree


@event_priority(100)  # before mkdocstrings reads its handler configuration
def on_config(config, **kwargs):
    global _TREE
    if _TREE is None:
        _TREE = _mirror(os.path.dirname(os.path.abspath(config.config_file_path)))
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python["paths"] = [_TREE]
    return config
