"""The README and the docs site as a reader meets them: every Python example runs as written
(each in a fresh namespace) and prints what its `# …` comment shows (`...` stands for any
text); the site builds with warnings as errors; nothing links outside the repository."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [
    (page, i, code)
    for page in PAGES
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S))
]
# a single-line print with the output it shows: `print(...)  # output`
SHOWN = re.compile(r"^\s*print\(.*\)\s+# (?P<out>.+)$")


def expected_outputs(code: str) -> list[str]:
    return [m.group("out").strip() for line in code.splitlines() if (m := SHOWN.match(line))]


def matches(shown: str, printed: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in shown.split("..."))
    return re.fullmatch(pattern, printed.strip()) is not None


# an example that needs an extra says so on its first line, for the reader and for this test
NEEDS = re.compile(r"# needs the (?P<extra>[\w-]+) extra")
EXTRA_MODULE = {"torch": "torch", "cpu-engine": "vllm", "ray": "ray"}


def skip_without(extra: str) -> None:
    """Skip, naming the extra and its install line, where `extra` is not installed."""
    if importlib.util.find_spec(EXTRA_MODULE[extra]) is None:
        pytest.skip(f"the {extra} extra is not installed: pip install -e '.[{extra}]'")


def test_the_docs_have_examples() -> None:
    assert len(BLOCKS) >= 15


@pytest.mark.parametrize(
    ("page", "code"),
    [(page, code) for page, _, code in BLOCKS],
    ids=[f"{page.relative_to(ROOT)}:{i}" for page, i, _ in BLOCKS],
)
def test_each_example_runs_and_prints_what_it_shows(page: Path, code: str) -> None:
    if (need := NEEDS.match(code)) is not None:
        skip_without(need.group("extra"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(page), "exec"), {"__name__": "docs_example"})
    printed = out.getvalue().splitlines()
    shown = expected_outputs(code)
    if not shown:
        return
    # every print with a `# …` comment prints one line; match them in order among the output
    at = 0
    for want in shown:
        while at < len(printed) and not matches(want, printed[at]):
            at += 1
        assert at < len(printed), f"{page.name}: nothing printed {want!r}; printed {printed}"
        at += 1


def test_nothing_links_outside_the_repository() -> None:
    offenders = []
    for path in [
        *PAGES,
        *ROOT.glob("src/**/*.py"),
        *ROOT.glob("examples/*"),
        *ROOT.glob("benchmarks/*.py"),
    ]:
        text = path.read_text(errors="replace")
        for needle in ("../shared", "/work/shared", "seeds/00"):
            if needle in text:
                offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert not offenders, offenders


@pytest.mark.skipif(
    shutil.which("mkdocs") is None and not Path(sys.executable).with_name("mkdocs").exists(),
    reason="the docs extra is not installed: pip install -e '.[docs]'",
)
def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    proc = subprocess.run(
        [
            str(mkdocs) if mkdocs.exists() else "mkdocs",
            "build",
            "--strict",
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            "NO_MKDOCS_2_WARNING": "1",
            "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        },
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "site" / "services" / "rollout" / "index.html").exists()


@pytest.mark.skipif(
    importlib.util.find_spec("cogapp") is None,
    reason="the docs extra is not installed: pip install -e '.[docs]'",
)
def test_every_figure_is_what_its_stored_result_renders() -> None:
    """The figures of the README and the docs are rendered from stored results
    (`docs/render.py`): a figure typed by hand into a block, or a stored result changed
    without rendering, differs here."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "render.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]


def test_every_stored_result_names_its_command_date_and_seed() -> None:
    for path in sorted((ROOT / "docs" / "results").glob("*.json")):
        doc = json.loads(path.read_text())
        assert {"command", "date", "seed", "records"} <= set(doc), path.name
        assert doc["command"].startswith(("loom ", "python ")), (path.name, doc["command"])
        assert doc["records"], path.name


def test_the_readme_install_lines_are_what_ci_runs() -> None:
    """CI (`.ci/run`) runs every install line the README prints, exactly as printed."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    lines = [
        line.strip()
        for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
        for line in block.splitlines()
        if "pip install" in line and "&& loom " not in line
    ]
    # the quick-start line installs and then reproduces: CI installs the same way
    lines += [
        line.split(" && loom ")[0].strip()
        for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
        for line in block.splitlines()
        if "pip install" in line and "&& loom " in line
    ]
    assert lines
    for line in lines:
        assert line in ci, f"the README prints {line!r}, which .ci/run does not run"


def test_the_docs_cite_no_issue_numbers() -> None:
    """Readers cannot see the project's issues: the docs say what they mean instead."""
    offenders = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if re.search(r"\bissues? #?\d+|\bissue-\d+", line, re.I):
                offenders.append(f"{page.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def benchmark_commands() -> list[tuple[str, list[str]]]:
    """Every `python benchmarks/…` command in the bash blocks of the README and the docs, its
    continuation lines joined and its comment cut; lines showing optional parts (`[…]`) are
    forms, not commands, and left out."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.split(" #")[0].strip()
                if line.startswith("python benchmarks/") and "[" not in line:
                    found.append((f"{page.relative_to(ROOT)}: {line}", line.split()[1:]))
    return found


# parse the script's arguments with its own parser, then stop before it runs anything
PARSE_ONLY = """
import argparse, runpy, sys
parse = argparse.ArgumentParser.parse_args
def parse_then_stop(self, args=None, namespace=None):
    parse(self, args, namespace)
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = parse_then_stop
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("shown, argv", benchmark_commands(), ids=lambda v: str(v)[:80])
def test_every_benchmark_command_the_docs_print_is_accepted(shown: str, argv: list[str]) -> None:
    """A benchmark command printed in the docs takes the options it is printed with: each is
    parsed by its script's own parser (and stopped before it runs)."""
    proc = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    missing = re.search(r"No module named '(\w+)", proc.stderr)
    if proc.returncode and missing and missing.group(1) in EXTRA_MODULE.values():
        skip_without(next(e for e, m in EXTRA_MODULE.items() if m == missing.group(1)))
    assert proc.returncode == 0, f"{shown}\n{proc.stderr[-2000:]}"


def loom_commands() -> list[tuple[str, list[str]]]:
    """Every `loom …` command in the bash blocks of the README and the docs, as
    `benchmark_commands` finds them (a trailing `&` and a redirect cut)."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = re.split(r" #| > | &&", line)[0].strip().rstrip("&").strip()
                if line.startswith("loom ") and "[" not in line:
                    found.append((f"{page.relative_to(ROOT)}: {line}", shlex.split(line)[1:]))
    return found


@pytest.mark.parametrize("shown, argv", loom_commands(), ids=lambda v: str(v)[:80])
def test_every_loom_command_the_docs_print_is_accepted(shown: str, argv: list[str]) -> None:
    """A `loom` command printed in the docs names a command that exists and options it takes:
    parsed by the command line's own parser, command group by command group, and not run."""
    import typer

    from loom.cli import app

    command = typer.main.get_command(app)  # typer's own click: a group resolves commands
    parent, name, args = None, "loom", argv
    while True:
        ctx = command.make_context(name, list(args), parent=parent)
        if not hasattr(command, "resolve_command"):
            break
        rest = [*ctx._protected_args, *ctx.args]
        assert rest, f"{shown}: {name} needs a command"
        found, sub, args = command.resolve_command(ctx, rest)
        assert sub is not None and found is not None, f"{shown}: no command {rest[0]!r}"
        parent, name, command = ctx, found, sub


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_stored_results_are_not_ignored_by_git() -> None:
    """A stored result git ignores renders here and is missing from every clone."""
    stored = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "results").glob("*.json"))
    proc = subprocess.run(
        ["git", "check-ignore", "--no-index", *stored], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.stdout.strip() == "", f"ignored by .gitignore: {proc.stdout}"
