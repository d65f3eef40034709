"""MkDocs hook (``hooks:`` in mkdocs.yml): adds the pages written from the code
(``migrate.docgen``) to the site, so the CLI reference and the finding catalogue are
rebuilt from the commands and codes at every build and cannot drift."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

# mkdocs loads this file by path; the packages it documents are the checkout's, not an
# installed copy's
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def on_files(files: Files, config) -> Files:
    from migrate import docgen

    for path, text in docgen.pages().items():
        files.append(File.generated(config, path, content=text))
    return files
