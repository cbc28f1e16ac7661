"""The sandbox runs the interpreter it is given: a Python or a virtual environment under /tmp
(which the sandbox replaces by a private one) starts, found by path, on PATH or through a
script's `#!`; paths the configuration lists are shown read-only wherever they are; and the
rest of the host's /tmp stays hidden, an action's own /tmp private."""

from __future__ import annotations

import contextlib
import site
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from action_server_client import Client

from loom.core.errors import ConfigError
from loom.runtime.actions import ActionDriver, ActionServerConfig
from loom.runtime.actions.sandbox import Bubblewrap, bubblewrap_missing, program_paths
from loom.runtime.engine import free_port

NO_BWRAP = bubblewrap_missing()
needs_bwrap = pytest.mark.skipif(NO_BWRAP is not None, reason=f"no sandbox: {NO_BWRAP}")
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain virtual environment under /tmp (pytest's temporary directories live there)."""
    root = tmp_path_factory.mktemp("venv") / "env"
    assert root.is_relative_to("/tmp"), f"pytest's temporary directory is not in /tmp: {root}"
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(root)], check=True)
    tool = root / "bin" / "where"  # a console script, as pip writes them
    tool.write_text(f"#!{root}/bin/python\nimport sys\nprint(sys.prefix)\n")
    tool.chmod(0o755)
    return root


@pytest.fixture
def secret() -> Iterator[Path]:
    """A file in the host's /tmp that no action may see."""
    path = Path("/tmp") / f"loom-test-secret-{uuid.uuid4().hex}"
    path.write_text("secret")
    yield path
    path.unlink()


PREFIX = "import sys; print(sys.prefix)"


@needs_bwrap
def test_a_venv_under_tmp_runs_in_the_sandbox(
    make_client: Callable[..., Client], venv: Path, secret: Path
) -> None:
    client = make_client(sandbox="bwrap")
    by_path = client.run(command=[str(venv / "bin" / "python"), "-c", PREFIX])
    assert by_path["status"] == "succeeded", by_path
    assert by_path["stdout"] == f"{venv}\n"  # the venv's interpreter, not its base
    on_path = client.run(
        command=["python", "-c", PREFIX], env={"PATH": f"{venv}/bin:/usr/bin:/bin"}
    )
    assert on_path["status"] == "succeeded" and on_path["stdout"] == f"{venv}\n", on_path
    script = client.run(command=[str(venv / "bin" / "where")])
    assert script["status"] == "succeeded" and script["stdout"] == f"{venv}\n", script
    # what the sandbox shows of /tmp is what the command needs, read-only; nothing else
    probe = (
        "import os, sys; "
        f"print(os.path.exists({str(secret)!r}), os.path.exists({str(venv.parent)!r} + '/..'), "
        f"os.access({str(venv)!r}, os.W_OK)); "
        "open('/tmp/mine', 'w').write('x'); print(sorted(os.listdir('/tmp'))[:1])"
    )
    seen = client.run(command=[str(venv / "bin" / "python"), "-c", probe])
    assert seen["status"] == "succeeded", seen
    assert seen["stdout"].splitlines()[0] == "False True False"
    assert not Path("/tmp/mine").exists()  # written to the action's own /tmp


@pytest.fixture(scope="module")
def loom_venv(venv: Path) -> Path:
    """`venv` that imports Loom and its dependencies from this test run's environment, as a
    venv under /tmp that Loom was installed in would."""
    import loom

    site_packages = next((venv / "lib").glob("python3*/site-packages"))
    lines = [f"import site; site.addsitedir({d!r})" for d in site.getsitepackages()]
    lines.append(str(Path(loom.__file__).parents[1]))
    (site_packages / "loom-test-env.pth").write_text("\n".join(lines) + "\n")
    return venv


@needs_bwrap
def test_a_server_run_from_a_venv_under_tmp_shows_its_interpreter(
    loom_venv: Path, tmp_path: Path
) -> None:
    # the README's quick start followed in a venv under /tmp: the server's interpreter is
    # there, and an action runs it (here through a shell, so that only the server's own
    # interpreter, not the command's executable, makes it visible)
    python = loom_venv / "bin" / "python"
    port = free_port()
    cmd = [str(python), "-m", "loom.cli", "serve", "actions", "--port", str(port)]
    cmd += ["--workdir", str(tmp_path / "work"), "--sandbox", "bwrap"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/healthz", trust_env=False).status_code == 200:
                    break
            assert server.poll() is None, server.communicate()[1].decode()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        body = {"trajectory_id": "t", "command": ["sh", "-c", f"exec {python} -c '{PREFIX}'"]}
        with httpx.Client(base_url=url, trust_env=False, timeout=30) as http:
            aid = http.post("/v1/actions", json=body).json()["id"]
            v = http.get(f"/v1/actions/{aid}", params={"wait_s": 20}).json()
        assert v["status"] == "succeeded", v
        assert v["stdout"] == f"{loom_venv}\n"
    finally:
        server.terminate()
        server.communicate(timeout=30)


@needs_bwrap
def test_configured_binds_are_shown_read_only(
    make_client: Callable[..., Client], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "table.csv").write_text("a,b\n")
    read = ["cat", str(data / "table.csv")]
    write = ["sh", "-c", f"echo x > {data}/new"]
    plain = make_client(sandbox="bwrap")
    assert plain.run(command=read)["status"] == "failed"  # under /tmp: hidden
    bound = make_client(sandbox="bwrap", sandbox_ro_binds=(data,))
    v = bound.run(command=read)
    assert v["status"] == "succeeded" and v["stdout"] == "a,b\n"
    w = bound.run(command=write)
    assert w["status"] == "failed" and "Read-only file system" in w["stderr"]
    assert not (data / "new").exists()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("relative/dir", "not an absolute path"),
        ("/", "would show the host's /tmp"),
        ("/tmp", "would show the host's /tmp"),
        ("/tmp/..", "would show the host's /tmp"),
    ],
)
def test_binds_that_would_open_tmp_are_refused(path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ActionServerConfig(sandbox_ro_binds=(Path(path),))


@needs_bwrap
def test_a_bind_that_cannot_be_shown_stops_the_server(tmp_path: Path) -> None:
    missing = ActionServerConfig(workdir=tmp_path / "w", sandbox_ro_binds=(tmp_path / "nope",))
    with pytest.raises(ConfigError, match=f"cannot show {tmp_path}/nope .* does not exist"):
        ActionDriver(missing)
    inside = ActionServerConfig(workdir=tmp_path / "w", sandbox_ro_binds=(tmp_path / "w",))
    with pytest.raises(ConfigError, match="in the workspaces' directory"):
        ActionDriver(inside)


# -- what a program needs, without a sandbox ---------------------------------------------------


def _venv_at(root: Path, home: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(f"home = {home}\nversion = 3.11.7\n")
    python = root / "bin" / "python"
    python.symlink_to(home / "python3")
    return python


def test_a_venv_whose_base_lives_in_tmp_needs_both(tmp_path: Path) -> None:
    base = tmp_path / "python"  # an interpreter installed under /tmp, say by uv
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python3").write_text("")
    python = _venv_at(tmp_path / "env", base / "bin")
    needed = program_paths(python)
    assert tmp_path / "env" in needed and base in needed
    box = Bubblewrap("bwrap", hide=(tmp_path / "work",))
    argv = box.argv(["x"], workspace=Path("/w"), env={}, network=False, reveal=needed)
    binds = [tuple(argv[i + 1 : i + 3]) for i, a in enumerate(argv) if a == "--ro-bind"]
    # the venv and the base, each once, beside the system; nothing of /tmp above them
    assert binds == [("/", "/"), (str(tmp_path / "env"),) * 2, (str(base), str(base))]
    assert argv.index("--tmpfs") < argv.index(str(base))  # shown on top of the private /tmp


def test_nothing_of_tmp_itself_nor_the_workspaces_is_revealed(tmp_path: Path) -> None:
    tool = Path("/tmp") / f"loom-tool-{uuid.uuid4().hex}"  # a program right in /tmp
    tool.write_text("#!/bin/sh\n")
    try:
        box = Bubblewrap("bwrap", hide=(tmp_path,))
        hidden = tmp_path / "bin" / "tool"
        argv = box.argv(
            ["x"], workspace=Path("/w"), env={}, network=False, reveal=program_paths(tool)
        )
        binds = [argv[i + 2] for i, a in enumerate(argv) if a == "--ro-bind"]
        assert binds == ["/", str(tool)]  # the file alone, not /tmp
        argv = box.argv(["x"], workspace=Path("/w"), env={}, network=False, reveal=[hidden])
        assert str(hidden) not in argv
    finally:
        tool.unlink()


@needs_bwrap
def test_a_relative_workdir_runs_actions_in_the_sandbox(
    make_client: Callable[..., Client], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--workdir results/actions`, relative to where the server starts (as `loom run grpo
    --out results/…` gives it): the sandbox hides and binds the workspaces by absolute path."""
    monkeypatch.chdir(tmp_path)
    client = make_client(sandbox="bwrap", workdir=Path("results") / "actions")
    done = client.run(command=["sh", "-c", "echo ok > made; cat made"])
    assert done["status"] == "succeeded" and done["stdout"] == "ok\n", done
    assert list((tmp_path / "results" / "actions").rglob("made"))
