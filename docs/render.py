"""Render the figures of the README and the docs from stored results.

Every measured figure in `README.md` and `docs/**/*.md` sits in a cog block
(https://nedbatchelder.com/code/cog/): a Markdown comment holding a line or two of Python
that reads a stored result (`docs/results/NAME.json`, written by the command it names) and
writes the table or sentence below it, up to the block's end marker:

    <!-- [[[cog
    r = result("heddle-quick-seed1")
    para(f"PPS beats FCFS by {x(r.one(experiment='summary', ...)['vs_fcfs'])} ...")
    ]]] -->
    (generated: never edit by hand)
    <!-- [[[end]]] -->

A stored result is the JSON document a `loom reproduce … --json` or `benchmarks/… --json` run
wrote: its `command`, `date`, `seed`, `commit` and `records`. The plots under
`docs/images/reproductions/` are drawn from the same stored results by the experiments' own
plot functions.

    python docs/render.py            # rewrite every block and plot from the stored results
    python docs/render.py --check    # exit 1, with a diff, where a page differs from its results
    python docs/render.py --rerun NAME   # run NAME's stored command again, then render

`tests/test_docs.py` runs `--check`: a figure typed by hand into a block, or a stored result
changed without rendering, fails the suite.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))

from figures.core import PAGES, ROOT, StoredResultError, result  # noqa: E402
from figures.plots import IMAGES, PLOTS, render_plots  # noqa: E402


def _cog(args: list[str]) -> int:
    from cogapp import Cog  # the docs extra

    pages = [str(p) for p in PAGES if "[[[cog" in p.read_text()]
    prologue = f"import sys; sys.path.insert(0, {str(DOCS)!r}); from figures import *"
    return int(Cog().main(["cog", *args, "-p", prologue, *pages]))


def check() -> int:
    """0 where every page matches what its stored results render and every reproduction plot a
    page shows is drawn from a stored result; else 1, saying what differs."""
    code = _cog(
        [
            "--check",
            "--diff",
            "--check-fail-msg=render the docs from their stored results: python docs/render.py",
        ]
    )
    with tempfile.TemporaryDirectory() as tmp:
        drawn = {path.name for path in render_plots(Path(tmp))}
    shown = {
        name
        for page in PAGES
        for name in re.findall(r"images/reproductions/([\w.-]+\.png)", page.read_text())
    }
    for name in sorted(shown - drawn):
        print(f"{name}: a page shows it, but no stored result draws it (figures/plots.py)")
        code = 1
    return code


def render() -> int:
    code = _cog(["-r"])
    if code == 0 and PLOTS:
        render_plots(IMAGES)
    return code


def rerun(name: str) -> int:
    """Run a stored result's command again (its JSON replaced), then render."""
    cmd = shlex.split(result(name).command)
    if cmd[0] == "loom":  # the console script, as the result names it
        cmd = [sys.executable, "-m", "loom.cli", *cmd[1:]]
    elif cmd[0] == "python":
        cmd[0] = sys.executable
    if "--json" not in cmd:
        raise StoredResultError(f"{name}: its command writes no JSON: {result(name).command}")
    print("$", shlex.join(cmd), flush=True)
    code = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    if code:
        return code
    result.cache_clear()
    return render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="fail where a page differs")
    group.add_argument("--rerun", metavar="NAME", help="run a stored result's command again")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    if args.rerun:
        return rerun(args.rerun)
    return render()


if __name__ == "__main__":
    sys.exit(main())
