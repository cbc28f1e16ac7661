"""Access and the ecosystem's interfaces: a bearer token, the Python client, SandboxFusion's
`/run_code` and Prometheus' `/metrics`, over real HTTP."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable

import pytest
from action_server_client import Client

from loom.client import ActionClient, ActionError, AsyncActionClient
from loom.runtime.actions import ActionServerConfig

TOKEN = "s3cret-token-for-tests"


def test_binding_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(ValueError, match="give a token"):
        ActionServerConfig(host="0.0.0.0")
    assert ActionServerConfig(host="0.0.0.0", token=TOKEN).token == TOKEN
    assert ActionServerConfig(host="0.0.0.0", allow_open=True).token is None  # warned at start
    assert "s3cret" not in repr(ActionServerConfig(token=TOKEN))


def test_cli_refuses_to_bind_beyond_loopback_without_a_token() -> None:
    from typer.testing import CliRunner

    from loom.cli import app

    out = CliRunner().invoke(app, ["serve", "actions", "--host", "0.0.0.0", "--port", "0"])
    assert out.exit_code != 0 and "token" in out.output


def test_with_a_token_every_route_but_health_and_metrics_needs_it(
    make_client: Callable[..., Client],
) -> None:
    client = make_client(token=TOKEN)
    assert client.http.get("/healthz").status_code == 200
    assert client.http.get("/metrics").status_code == 200  # open_health (the default)
    closed = make_client(token=TOKEN, open_health=False)
    assert closed.http.get("/healthz").status_code == 401
    assert closed.http.get("/metrics").status_code == 401
    for method, path in (("GET", "/v1/stats"), ("POST", "/v1/actions")):
        r = client.http.request(method, path, json={})
        assert r.status_code == 401 and "token" in r.text, (path, r.status_code)
    wrong = {"Authorization": "Bearer nope"}
    assert client.http.get("/v1/stats", headers=wrong).status_code == 401
    with ActionClient(client.server.url, token=TOKEN, trust_env=False) as actions:
        assert actions.run("t", command=["true"])["status"] == "succeeded"


def test_the_sync_client(client: Client) -> None:
    with ActionClient(client.server.url, trust_env=False) as actions:
        view = actions.run("t", command=["sh", "-c", "echo $((6 * 7))"], timeout_s=10)
        assert (view["status"], view["stdout"]) == ("succeeded", "42\n")
        aid = actions.submit("t", command=["sleep", "30"])
        assert actions.cancel(aid)["status"] == "cancelled"
        assert actions.wait(aid)["status"] == "cancelled"
        assert actions.end_trajectory("t")["workspace_removed"] is True
        with pytest.raises(ActionError) as err:
            actions.submit("t", command=["true"], timeout_s=-1)
        assert err.value.status == 400 and "timeout_s" in err.value.message
        with pytest.raises(ActionError, match="404"):
            actions.get("act-none")
        slow = actions.submit("t", command=["sleep", "30"])
        with pytest.raises(TimeoutError):
            actions.wait(slow, timeout_s=0.3)
        actions.end_trajectory("t")


def test_the_async_client(client: Client) -> None:
    async def go() -> list[dict]:
        async with AsyncActionClient(client.server.url, trust_env=False) as actions:
            views = await asyncio.gather(
                *(actions.run(f"a{i}", command=["sh", "-c", f"echo {i}"]) for i in range(4))
            )
            for i in range(4):
                await actions.end_trajectory(f"a{i}")
            return list(views)

    views = asyncio.run(go())
    assert [v["stdout"] for v in views] == [f"{i}\n" for i in range(4)]


def _run_code(client: Client, **body: object) -> dict:
    r = client.http.post("/run_code", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_run_code_speaks_sandboxfusion(client: Client) -> None:
    out = _run_code(
        client,
        code="import sys\nprint(open('data/in.txt').read().strip(), sys.stdin.read())",
        language="python",
        stdin="from stdin",
        files={"data/in.txt": base64.b64encode(b"from a file").decode()},
        fetch_files=["result.txt"],
        run_timeout=10,
    )
    assert out["status"] == "Success"
    run = out["run_result"]
    assert (run["status"], run["return_code"]) == ("Finished", 0)
    assert run["stdout"] == "from a file from stdin\n" and run["execution_time"] > 0
    failed = _run_code(client, code="echo nope >&2; exit 3", language="bash")
    assert failed["status"] == "Failed"
    assert (failed["run_result"]["return_code"], failed["run_result"]["stderr"]) == (3, "nope\n")
    slow = _run_code(client, code="sleep 30", language="bash", run_timeout=0.5)
    assert (slow["status"], slow["run_result"]["status"]) == ("Failed", "TimeLimitExceeded")
    made = _run_code(
        client, code="echo made > result.txt", language="bash", fetch_files=["result.txt"]
    )
    assert base64.b64decode(made["files"]["result.txt"]) == b"made\n"
    # its one-off trajectory is gone with its workspace
    assert not list(client.workdir.glob("run-code-*"))


@pytest.mark.parametrize(
    "body, message",
    [
        ({"code": "1", "language": "cobol"}, "language"),
        ({"code": "1", "language": "python", "run_timeout": "inf"}, "finite"),
        ({"code": "1", "language": "bash", "files": {"../x": ""}}, "stay in the workspace"),
        ({"code": "1", "language": "bash", "files": {"x": "not base64!"}}, "not base64"),
    ],
)
def test_run_code_refuses_bad_input(shared_client: Client, body: dict, message: str) -> None:
    r = shared_client.http.post("/run_code", json=body)
    assert r.status_code == 400 and message in r.text, r.text


def test_metrics_count_actions_by_kind_and_reason(client: Client) -> None:
    client.run(command=["true"])
    client.run(command=["false"])
    client.run(command=["sleep", "5"], timeout_s=0.2)
    text = client.http.get("/metrics").text
    assert 'loom_action_completion_seconds_count{kind="cpu_tool"} 3.0' in text
    assert 'loom_action_failures_total{kind="cpu_tool",reason="nonzero_exit"} 1.0' in text
    assert 'loom_action_failures_total{kind="cpu_tool",reason="timed_out"} 1.0' in text
    assert "loom_actions_busy_cores 0.0" in text and "loom_actions_queued 0.0" in text
