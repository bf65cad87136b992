"""The documentation site (issue 26): it builds with ``mkdocs build --strict``, every page renders
in headless Chromium (a title, a heading, non-empty content) and every internal link and anchor of
every page resolves, and every code block of the guides runs as written.

Code blocks, as ``test_readme.py`` (beside this file) does for the README: a page's fenced blocks run in order
in a fresh temporary folder (files persist from block to block, shell variables do not), with
the page's own budget ledger. ``bash`` blocks run with ``bash -euo pipefail``, ``python`` blocks
are executed in one namespace per page (so a page reads like a notebook). A block that must not
run (it needs a cluster, a server, credentials, or runs until stopped) says why in a
``<!-- no-run: REASON -->`` comment on the line before it; ``text`` blocks are output or
diagrams. Any other fence (untagged, another language) in a guide is an error, so that no code
block escapes the test. The pages of other owners (the architecture page and the planning page)
and the generated API reference are not guides.

Chromium: ``chromium --headless --dump-dom file://...`` gives each page's rendered DOM; the test
is skipped, saying why, only when no Chromium is installed (``.ci/run`` installs Debian's).
"""
from __future__ import annotations

import concurrent.futures as futures
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "mkdocs.yml").exists())
DOCS = ROOT / "docs"
NOT_GUIDES = {"architecture.md", "plan.md"}  # other owners' pages; reference/ is generated
SHELL, PYTHON = {"bash", "sh", "shell"}, {"python", "py"}
TEXT = {"text", "toml"}  # output, diagrams, file contents: not programs
NO_RUN = re.compile(r"^<!--\s*no-run:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')  # pymdownx.snippets, from the repository root
PAGE_TIMEOUT = 600  # seconds for all of one page's blocks
WORKERS = 2  # pages run side by side (the suite's target machine has 2 cores)


# --------------------------------------------------------------------------- code blocks
def guide_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md")
                  if p.relative_to(DOCS).as_posix() not in NOT_GUIDES
                  and p.relative_to(DOCS).parts[0] not in ("reference", "hooks"))


def blocks(page: Path) -> list[dict]:
    """The page's fenced blocks: language, code, first line number, and the no-run reason
    (None when the block runs)."""
    lines = page.read_text(encoding="utf-8").split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = []
        for s in lines[i + 1:j]:
            s = s[len(indent):] if s.startswith(indent) else s
            inc = SNIPPET.match(s)
            body.append((ROOT / inc.group(1)).read_text(encoding="utf-8").rstrip("\n") if inc
                        else s)
        code = "\n".join(body)
        prev = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        reason = NO_RUN.match(prev)
        out.append({"lang": lang, "code": code + "\n", "line": i + 1, "indent": indent,
                    "no_run": reason.group(1) if reason else None})
        i = j + 1
    return out


def runnable(page: Path) -> list[dict]:
    return [b for b in blocks(page) if b["no_run"] is None and b["lang"] in SHELL | PYTHON]


DRIVER = r'''
import json, subprocess, sys, time, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for b in blocks:
    where = f"{b['page']}:{b['line']} ({b['lang']})"
    print(f"----- {where}", flush=True)
    t = time.monotonic()
    if b["lang"] in ("bash", "sh", "shell"):
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", b["code"]], stdout=sys.stdout,
                           stderr=sys.stderr)
        if r.returncode != 0:
            print(f"FAILED {where}: exit status {r.returncode}", flush=True)
            sys.exit(1)
    else:
        try:
            exec(compile(b["code"], where, "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            print(f"FAILED {where}", flush=True)
            sys.exit(1)
    print(f"----- {where}: {time.monotonic() - t:.1f} s", flush=True)
'''


def run_page(page: Path) -> dict:
    rel = page.relative_to(DOCS).as_posix()
    todo = [dict(b, page=rel) for b in runnable(page)]
    work = tempfile.mkdtemp(prefix="ldp-beam-docs-")
    with open(os.path.join(work, ".blocks.json"), "w") as fh:
        json.dump(todo, fh)
    with open(os.path.join(work, ".driver.py"), "w") as fh:
        fh.write(DRIVER)
    env = dict(os.environ, LDP_BEAM_LEDGER=os.path.join(work, ".ledger.db"), MPLBACKEND="Agg",
               PYTHONWARNINGS="ignore")
    t = time.monotonic()
    # a session of its own, so that a timeout ends the commands a block started too
    proc = subprocess.Popen([sys.executable, ".driver.py", ".blocks.json"], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=PAGE_TIMEOUT)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        code = f"timeout after {PAGE_TIMEOUT} s"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"page": rel, "blocks": len(todo), "code": code, "output": out,
            "seconds": time.monotonic() - t}


@pytest.fixture(scope="module")
def page_runs(request):
    """The selected guides' blocks, run side by side (``WORKERS`` pages at a time): every guide
    with runnable blocks in a full run, only those selected with ``-k``."""
    selected = {item.callspec.params["page"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_guide_code_blocks_run"}
    pages = [p for p in guide_pages() if runnable(p)
             and p.relative_to(DOCS).as_posix() in selected]
    with futures.ThreadPoolExecutor(WORKERS) as pool:
        runs = list(pool.map(run_page, pages))
    return {r["page"]: r for r in runs}


def test_every_fence_is_run_or_says_why_not(capsys):
    """Every fenced block of a guide is executed, or is declared output (``text``), or says why
    it must not run; the no-run blocks are counted and listed (on the terminal, with the run)."""
    problems, skipped, ran = [], [], 0
    for page in guide_pages():
        rel = page.relative_to(DOCS).as_posix()
        for b in blocks(page):
            where = f"{rel}:{b['line']}"
            if b["no_run"] is not None:
                if not b["no_run"]:
                    problems.append(f"{where}: a no-run comment without a reason")
                skipped.append(f"{where} ({b['lang'] or 'untagged'}): {b['no_run']}")
            elif b["lang"] in SHELL | PYTHON:
                ran += 1
                if b["indent"]:
                    problems.append(f"{where}: an indented code block (keep runnable blocks at "
                                    "the margin)")
            elif b["lang"] not in TEXT:
                problems.append(f"{where}: fence {b['lang'] or 'without a language'!r}: tag it "
                                "bash or python (it runs), text (output), or say <!-- no-run: "
                                "why -->")
    with capsys.disabled():
        print(f"\ndocs: {ran} code blocks run; {len(skipped)} not run, each with its reason:")
        print("\n".join(f"  {s}" for s in skipped))
    assert not problems, "\n".join(problems)
    assert ran > 2 * len(skipped), (ran, skipped)


@pytest.mark.parametrize("page", [p.relative_to(DOCS).as_posix() for p in guide_pages()
                                  if runnable(p)])
def test_guide_code_blocks_run(page_runs, page):
    r = page_runs[page]
    print(f"{page}: {r['blocks']} blocks in {r['seconds']:.1f} s")
    assert r["code"] == 0, f"{page} (exit {r['code']}):\n{r['output'][-6000:]}"


# --------------------------------------------------------------------------- the site
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    warnings = [s for s in (r.stdout + r.stderr).splitlines() if s.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    return out.resolve()


def test_site_builds_strict_with_every_page(site):
    """Every Markdown page is in the built site, as an HTML page of its own."""
    missing = [p for p in DOCS.rglob("*.md")
               if not (site / p.relative_to(DOCS).with_suffix(".html")).exists()]
    assert not missing, missing
    assert (site / "reference" / "api" / "core.html").exists()


class _Dom(html.parser.HTMLParser):
    """What the checks need from a rendered page: the title, the article's text and headings,
    every element id, and every link (``a``/``link`` href, ``img``/``script`` src)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title, self.h1, self.text = "", "", []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self._in, self._depth, self._article = None, 0, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if a.get("name") and tag == "a":
            self.ids.add(a["name"])
        if tag in ("a", "link") and a.get("href"):
            self.links.append(a["href"])
        if tag in ("img", "script") and a.get("src"):
            self.links.append(a["src"])
        if tag == "title":
            self._in = "title"
        if tag == "article" and "md-content__inner" in (a.get("class") or ""):
            self._article = 1
        elif self._article and tag == "article":
            self._article += 1
        if self._article and tag == "h1":
            self._in = "h1"

    def handle_endtag(self, tag):
        if tag in ("title", "h1"):
            self._in = None
        if tag == "article" and self._article:
            self._article -= 1

    def handle_data(self, data):
        if self._in == "title":
            self.title += data
        elif self._in == "h1":
            self.h1 += data
        if self._article:
            self.text.append(data)


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def dump_dom(browser: str, page: Path, profile: str) -> str:
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-dev-shm-usage", "--no-first-run", f"--user-data-dir={profile}",
                        "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "<html" in r.stdout, (page, r.returncode, r.stderr[-2000:])
    return r.stdout


@pytest.fixture(scope="module")
def rendered(site, tmp_path_factory):
    browser = chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; .ci/run does): "
                    "the rendered pages cannot be checked")
    profiles = tmp_path_factory.mktemp("chromium")
    pages = sorted(site.rglob("*.html"))

    def one(ip):
        i, page = ip
        dom = _Dom()
        dom.feed(dump_dom(browser, page, str(profiles / f"p{i}")))
        return page.resolve(), dom

    with futures.ThreadPoolExecutor(4) as pool:
        return dict(pool.map(one, enumerate(pages)))


def test_every_page_renders_with_title_and_content(site, rendered):
    bad = []
    for page, dom in rendered.items():
        rel = page.relative_to(site).as_posix()
        words = len(" ".join(dom.text).split())
        if not dom.title.strip().endswith("ldp-beam"):
            bad.append(f"{rel}: title {dom.title!r}")
        if not dom.h1.strip():
            bad.append(f"{rel}: no heading in the main content")
        if words < (3 if rel == "404.html" else 40):
            bad.append(f"{rel}: main content of {words} words")
    assert not bad, "\n".join(bad)
    assert len(rendered) >= 30


def test_every_internal_link_resolves(site, rendered):
    """Every internal href/src of every rendered page names a file of the site, and its
    #anchor an element id of the page it points to."""
    bad, checked = [], 0
    for page, dom in rendered.items():
        for link in dom.links:
            parts = urlsplit(link)
            if parts.scheme not in ("", "file") or parts.netloc:
                continue  # external (http, https, mailto, data, javascript)
            checked += 1
            if parts.scheme == "file":
                target = Path(unquote(parts.path))
            elif parts.path.startswith("/"):  # from the site's root (the 404 page's links)
                target = (site / unquote(parts.path).lstrip("/")).resolve()
            elif parts.path:
                target = (page.parent / unquote(parts.path)).resolve()
            else:
                target = page
            if target.is_dir():
                target = target / "index.html"
            rel = page.relative_to(site).as_posix()
            if not target.exists() or not target.resolve().is_relative_to(site.resolve()):
                bad.append(f"{rel}: {link} -> no such file")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = rendered[target.resolve()].ids if target.resolve() in rendered else set()
                if unquote(parts.fragment) not in ids:
                    bad.append(f"{rel}: {link} -> no anchor #{parts.fragment}")
    assert not bad, "\n".join(sorted(set(bad)))
    assert checked > 500


# --------------------------------------------------------------------------- generated blocks
def test_reproductions_results_block_is_generated_from_the_committed_outputs():
    """The results block of docs/reproductions.md is exactly what `ldp-beam reproduce report
    --out docs/figures --readme docs/reproductions.md` writes from the committed recipe outputs
    (rerun it after changing them; the links are relative to the page)."""
    from ldp_beam.pipelines.cli import FAMILIES
    from ldp_beam.reproduce.report import readme_block, results_section

    page = DOCS / "reproductions.md"
    expected = results_section(str(DOCS / "figures"), FAMILIES, "figures", str(DOCS),
                               readme=str(page))
    assert expected.startswith("Generated by `ldp-beam reproduce report --out docs/figures "
                               "--readme docs/reproductions.md` ")  # the command below
    assert readme_block(str(page)) == expected.strip("\n"), (
        "docs/reproductions.md's results block is stale: run `ldp-beam reproduce report --out "
        "docs/figures --readme docs/reproductions.md`")


def test_performance_page_keeps_the_bench_block():
    """`ldp-beam bench --readme docs/guides/performance.md` rewrites the table between these
    markers: they are there once each, in order, and the block names that command (the line
    `readme_table` writes for this page)."""
    from ldp_beam.pipelines.bench import README_END, README_START

    page = DOCS / "guides" / "performance.md"
    text = page.read_text()
    assert text.count(README_START) == 1 and text.count(README_END) == 1
    assert text.index(README_START) < text.index(README_END)
    block = text[text.index(README_START) + len(README_START):text.index(README_END)]
    assert block.lstrip("\n").startswith(
        "Generated by `ldp-beam bench --readme docs/guides/performance.md` on "), block[:200]
