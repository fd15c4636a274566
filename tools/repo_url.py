"""The companion's repository URL: one setting, `repository.url` in _config.yml.

Jupyter Book's repository, Binder and Colab buttons read it there. The other places that need it
read it from here or are checked against it:

* `tools/run_notebooks.py` copies it, and the Pages address derived from it, into the staged
  `_config.yml` as the MyST substitutions ``{{ repo_url }}``, ``{{ site_url }}`` and
  ``{{ pdf_link }}``, which the pages use; the build's environment notebook reads them there for
  the citation blocks;
* `CITATION.cff` (``repository-code``) and the install cell at the top of every notebook (for Colab)
  cannot read a file at run time: `tests/test_citation.py` checks that they hold the same URL;
* the GitHub Pages workflow runs ``python tools/repo_url.py --check URL`` with the repository it runs
  in and warns while the placeholder is still set.

    python tools/repo_url.py                 # print the URL
    python tools/repo_url.py --check URL     # exit 1 (with a message) if URL differs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PLACEHOLDER = "https://github.com/nwlib-companion/multihead-nw"


def repo_url(config: Path = ROOT / "_config.yml") -> str:
    """``repository.url`` of the book's configuration, without a trailing slash."""
    return str(yaml.safe_load(config.read_text())["repository"]["url"]).rstrip("/")


def site_url(url: str) -> str:
    """Where GitHub Pages publishes the book of repository ``url`` (``url`` itself if not on GitHub)."""
    owner_repo = url.rstrip("/").removeprefix("https://github.com/").split("/")
    return f"https://{owner_repo[0]}.github.io/{owner_repo[1]}" if len(owner_repo) == 2 else url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", metavar="URL", help="the repository this copy actually lives in")
    args = parser.parse_args(argv)
    url = repo_url()
    if args.check is None:
        print(url)
        return 0
    if url != args.check.rstrip("/"):
        note = " (still the placeholder)" if url == PLACEHOLDER else ""
        print(
            f"_config.yml repository.url is {url}{note}, but this repository is {args.check}: set it "
            "there (and in CITATION.cff and the notebooks' install cell, see tests/test_citation.py)"
        )
        return 1
    print(f"repository URL {url} is set")
    return 0


if __name__ == "__main__":
    sys.exit(main())
