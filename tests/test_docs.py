"""The README and the docs site as a reader meets them: every Python example runs as written
(each in a fresh namespace) and prints what its `# …` comment shows (`...` stands for any
text); the site builds with warnings as errors; nothing links outside the repository."""

from __future__ import annotations

import contextlib
import io
import re
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


def test_the_docs_have_examples() -> None:
    assert len(BLOCKS) >= 15


@pytest.mark.parametrize(
    ("page", "code"),
    [(page, code) for page, _, code in BLOCKS],
    ids=[f"{page.relative_to(ROOT)}:{i}" for page, i, _ in BLOCKS],
)
def test_each_example_runs_and_prints_what_it_shows(page: Path, code: str) -> None:
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
