"""Sphinx configuration of fp8mp's user guide (`make docs` builds it into build/docs)."""
import os
import sys

# The guide documents the fp8mp of this checkout (the in-place build of `make build`), not an installed one.
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

import fp8mp  # noqa: E402  (after the path: the API reference needs the built extension)

project = "fp8mp"
author = "fp8mp contributors"
release = fp8mp.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = [("Keys", "params_style"), ("Saved buffers", "params_style"), ("Buffers not saved", "params_style")]

html_theme = "furo"
html_title = f"fp8mp {release}"
