"""The documentation: the site builds with warnings as errors, and what the pages say exists.

- The Sphinx site (docs/conf.py) builds with ``-W``: a broken cross-reference, a page missing
  from the index or a docstring that is not valid reStructuredText fails here.
- Every link of the README, CONTRIBUTING, CHANGELOG and docs/ stays in the repository (a file
  that exists, and its heading when the link names one) or is a public http(s) URL.
- Every ``HOROVOD_*``/``HVDL_*`` name the pages mention is one the code uses, and every
  ``horovodliterun`` command line they show parses with horovodliterun's own parser.
- Every public name of ``horovodlite.torch`` (and ``hvd.elastic``) has a docstring of its own and
  is in the generated API reference.
- Every shell block of the README says whether the tests run it: ``<!-- run by WHERE -->`` or
  ``<!-- not run: why -->`` on the line before it; the README's complete training script runs
  (one process, ``python`` alone: a multi-rank job belongs to the main lane).

Single-process (one Sphinx build, a few seconds): the build lane (tests/conftest.py BUILDS).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import ipaddress
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
                *(ROOT / "docs").glob("*.md")])
# Where the names the pages mention must occur to exist: the code, not the docs (the test suite's
# own knobs, e.g. HVDL_CHAOS_EVENTS, are read in tests/; this file names none).
CODE = ["horovodlite", "csrc", "scripts", "cmake", "benchmarks", "examples", "docker", "tests",
        ".ci", "setup.py", "CMakeLists.txt", "pyproject.toml"]
CODE_SUFFIXES = {".py", ".cc", ".h", ".cu", ".cuh", ".cmake", ".sh", ".txt", ".toml", ".yaml",
                 ".cpu", ".gpu", ""}
NAME = re.compile(r"\b((?:HOROVOD|HVDL)_[A-Z0-9_]*)(\*?)")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w{}-]*)")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SHELL = {"bash", "sh", "shell", "console"}
MARK_RUN = re.compile(r"^<!-- run by (\S+)")
MARK_NOT_RUN = re.compile(r"^<!-- not run: \S.* -->$")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _split(text: str):
    """(prose lines, [(info, preceding non-blank line, block lines)]) of a Markdown text:
    fenced blocks apart from the rest, code spans left in the prose."""
    prose, blocks = [], []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        before = next((p for p in reversed(lines[:i]) if p.strip()), "")
        fence, body = m.group(2), []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        blocks.append((m.group(3).lower(), before.strip(), body))
        i += 1
    return prose, blocks


def _slug(heading: str) -> str:
    """GitHub's (and myst-parser's) anchor of a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set:
    prose, _ = _split(_read(path))
    return {_slug(line.lstrip("#")) for line in prose if re.match(r"^#{1,6} ", line)}


# ------------------------------------------------------------------------------- the build


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, HOROVODLITE_NO_REBUILD="1")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q",
                           "-b", "html", str(ROOT / "docs"), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc, out


def test_the_site_builds_with_warnings_as_errors(site):
    proc, out = site
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert (out / "index.html").is_file() and (out / "api.html").is_file()


def test_every_page_is_in_the_site():
    index = _read(ROOT / "docs" / "index.md")
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")} - {"index"}
    listed = set(re.findall(r"^([\w-]+)$", index, flags=re.M))
    assert pages <= listed, f"docs/index.md's toctrees lack {sorted(pages - listed)}"


# ------------------------------------------------------------------------------- links


def _public(url: str) -> bool:
    parsed = urlparse(url)
    host = parsed.hostname or ""
    if parsed.scheme not in ("http", "https") or not host:
        return False
    if host == "localhost" or host.endswith((".local", ".internal", ".lan")):
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "." in host
    return address.is_global


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_links_stay_in_the_repository(page):
    text = _read(page)
    prose, _ = _split(text)
    body = re.sub(r"`[^`\n]*`", "", "\n".join(prose))  # code spans are not links
    bad = []
    assert "../shared" not in text and "shared/DESIGN" not in text, f"{_rel(page)} names ../shared"
    for target in LINK.findall(body) + re.findall(r"<a\s+href=\"([^\"]+)\"", body):
        if target.startswith("mailto:"):
            continue
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            if not _public(target):
                bad.append(f"{target}: not a public URL")
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(ROOT):
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: {_rel(dest)} has no heading #{anchor}")
    assert not bad, f"{_rel(page)}: " + "; ".join(bad)


# ------------------------------------------------------------------------------- names, options


def _code_names() -> set:
    names = set()
    for entry in CODE:
        place = ROOT / entry
        files = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
        for path in files:
            if (path.suffix in CODE_SUFFIXES and "__pycache__" not in path.parts
                    and path != Path(__file__).resolve()):
                try:
                    names.update(n.rstrip("_") for n, _ in NAME.findall(_read(path)))
                except UnicodeDecodeError:
                    continue
    return names


def test_every_variable_the_docs_name_exists():
    known = _code_names()
    unknown = []
    for page in PAGES:
        for name, star in NAME.findall(_read(page)):
            name = name.rstrip("_")
            if star or name in ("HOROVOD", "HVDL"):  # a family: HOROVOD_HIERARCHICAL_*
                ok = any(k.startswith(name) for k in known)
            else:
                ok = name in known
            if not ok:
                unknown.append(f"{_rel(page)}: {name}{star}")
    assert not unknown, "names no code uses: " + ", ".join(sorted(set(unknown)))


class _Refused(Exception):
    pass


@contextlib.contextmanager
def _no_rebuild():
    """Imports horovodlite without rebuilding its extension, then leaves the environment as it
    was: a variable left set reaches every later test of this worker (test_install's check
    that a checkout rebuilds on import)."""
    old = os.environ.get("HOROVODLITE_NO_REBUILD")
    os.environ["HOROVODLITE_NO_REBUILD"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HOROVODLITE_NO_REBUILD", None)
        else:
            os.environ["HOROVODLITE_NO_REBUILD"] = old


def _parser() -> argparse.ArgumentParser:
    with _no_rebuild():
        from horovodlite.runner.launch import build_parser

    parser = build_parser()

    def error(message):
        raise _Refused(message)

    parser.error = error
    return parser


def _commands(page: Path):
    """Every horovodliterun command line shown in ``page``: in code blocks (continuation lines
    joined) and in code spans."""
    prose, blocks = _split(_read(page))
    candidates = re.findall(r"`([^`\n]*horovodliterun[^`\n]*)`", "\n".join(prose))
    indented = [line[4:] for line in prose if line.startswith("    ")]
    for lines in [b for _, _, b in blocks] + [indented]:
        candidates += re.sub(r"\\\n\s*", " ", "\n".join(lines)).split("\n")
    for line in candidates:
        at = line.find("horovodliterun")
        if at < 0 or (at > 0 and not re.match(r"[\s$(`]", line[at - 1])):
            continue
        yield line[at:]


def _argv(command: str) -> list | None:
    command = re.split(r"\s(?:\||&&|;|#)\s|\)", command)[0]
    try:
        words = shlex.split(command)[1:]
    except ValueError:
        return None
    # Placeholders (N, DIR, MIN MAX, ...) stand for values: any value will do for the names.
    return ["1" if re.fullmatch(r"[A-Z][A-Z_]*", w) else w for w in words if w != "..."]


def test_every_horovodliterun_command_the_docs_show_parses():
    parser, bad = _parser(), []
    flags = {s for a in parser._actions for s in a.option_strings}
    for page in PAGES:
        for command in _commands(page):
            argv = _argv(command)
            if argv is None:
                continue
            try:
                parser.parse_args(argv)
            except _Refused as exc:
                message = str(exc)
                if "unrecognized arguments" in message or "ambiguous option" in message:
                    bad.append(f"{_rel(page)}: `{command}`: {message}")
            except SystemExit:  # --help, --version: they print and exit
                pass
            for name in _options(argv, parser):  # horovodliterun's part, before the command
                if name not in flags:
                    bad.append(f"{_rel(page)}: `{command}`: no option {name}")
    assert not bad, "\n".join(bad)


def _options(argv: list, parser) -> list:
    """The option names in ``argv`` before the rank's command starts (values skipped)."""
    takes = {s: a.nargs for a in parser._actions for s in a.option_strings}
    names, i = [], 0
    while i < len(argv) and argv[i].startswith("-"):
        name = argv[i].split("=", 1)[0]
        names.append(name)
        nargs = takes.get(name, 0)
        if "=" in argv[i] or nargs == 0:
            i += 1
        else:
            i += 1 + (nargs if isinstance(nargs, int) else 1)
    return names


def test_the_migration_table_names_horovodliterun_options_that_exist():
    flags = {s for a in _parser()._actions for s in a.option_strings}
    rows = [r for r in _read(ROOT / "docs" / "migrating.md").split("\n")
            if r.startswith("| `-")]
    assert len(rows) > 30
    missing = []
    for row in rows:
        ours = row.split("|")[2]
        missing += [f for f in re.findall(r"`(-[\w-]+)`", ours) if f not in flags]
    assert not missing, f"docs/migrating.md names options horovodliterun lacks: {missing}"
    text = _read(ROOT / "docs" / "migrating.md")
    unmapped = [s for a in _parser()._actions for s in a.option_strings
                if not isinstance(a, argparse._HelpAction) and f"`{s}" not in text]
    assert not unmapped, f"docs/migrating.md does not mention horovodliterun's {unmapped}"


# ------------------------------------------------------------------------------- the API


def _public_names():
    with _no_rebuild():
        import horovodlite.torch as hvd

    for name in hvd.__all__:
        yield f"horovodlite.torch.{name}", getattr(hvd, name)
    for name in hvd.elastic.__all__:
        yield f"horovodlite.torch.elastic.{name}", getattr(hvd.elastic, name)


def _own_doc(obj) -> str:
    if inspect.isclass(obj):
        return vars(obj).get("__doc__") or ""
    if inspect.isfunction(obj) or inspect.ismodule(obj) or inspect.isbuiltin(obj):
        return obj.__doc__ or ""
    return "(a value)"  # constants: documented in docs/api.md, checked below


def test_every_public_name_has_a_docstring_and_is_in_the_reference(site):
    proc, out = site
    assert proc.returncode == 0, "the site did not build (see the test above)"
    html = _read(out / "api.html")
    undocumented, absent = [], []
    for qualified, obj in _public_names():
        if not _own_doc(obj).strip():
            undocumented.append(qualified)
        if (f'id="{qualified}"' not in html and f'id="module-{qualified}"' not in html):
            absent.append(qualified)
    assert not undocumented, f"no docstring: {undocumented}"
    assert not absent, f"missing from the API reference (docs/api.md): {absent}"


def test_the_launcher_reference_is_generated_from_its_parser(site):
    _, out = site
    html = _read(out / "api.html")
    options = [s for a in _parser()._actions for s in a.option_strings
               if s.startswith("--") and not isinstance(a, argparse._HelpAction)]
    assert options and all(o in html for o in options), [o for o in options if o not in html]


# ------------------------------------------------------------------------------- the README


def test_every_readme_shell_block_says_whether_the_tests_run_it():
    text = _read(ROOT / "README.md")
    prose, blocks = _split(text)
    indented = [line for i, line in enumerate(prose)
                if line.startswith("    ") and i and not prose[i - 1].strip()]
    assert not indented, f"indented code blocks (use fenced ones, marked): {indented}"
    bad = []
    for info, before, body in blocks:
        if info not in SHELL:
            continue
        run = MARK_RUN.match(before)
        if run:
            where = ROOT / run.group(1)
            if not where.exists():
                bad.append(f"{body[0]!r}: run by {run.group(1)}, which does not exist")
            elif where.suffix == ".py":
                paths = [w for w in " ".join(body).split() if "/" in w and (ROOT / w).exists()]
                if not any(p in _read(where) for p in paths):
                    bad.append(f"{body[0]!r}: {run.group(1)} runs none of {paths}")
        elif not MARK_NOT_RUN.match(before):
            bad.append(f"{body[0]!r}: no '<!-- run by ... -->' or '<!-- not run: why -->' "
                       f"before it (found {before!r})")
    assert not bad, "\n".join(bad)


def test_the_readme_is_short_and_ci_finds_its_test_command():
    text = _read(ROOT / "README.md")
    assert len(text.split("\n")) <= 250
    # .ci/run's awk: the first line starting with bash or python after the marker line
    after = text.split("Run the whole test suite", 1)[1].split("\n")[1:]
    command = next(line.strip() for line in after if re.match(r"^ *(bash|python)", line))
    assert command == "bash scripts/install.sh --test && python -m pytest -n 3 --dist loadgroup"
    assert "Run the whole test suite" in _read(ROOT / ".ci" / "run")
    from horovodlite._version import __version__

    assert f"Version {__version__}," in text


def test_the_readme_training_script_trains(tmp_path):
    text = _read(ROOT / "README.md")
    section = text.split("## A complete training script", 1)[1]
    script = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    (tmp_path / "train.py").write_text(script)
    env = dict(os.environ, HOROVODLITE_NO_REBUILD="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    losses = [float(v) for v in re.findall(r"^epoch \d: loss ([\d.]+)$", proc.stdout, re.M)]
    assert len(losses) == 3 and losses[-1] < losses[0], proc.stdout
