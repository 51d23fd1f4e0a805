"""generic_sandbox through our code service (code_server, started here): reset/step, what persists between the
steps of one sample (files, exported variables, the directory), the editor, errors, the sandbox's limits. It is
played on a real vLLM engine, with the model forced to write the calls, in
tests/integration/test_agent_engine.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request

import pytest
from helpers.sandbox_service import bash_code_service

from open_instruct.agents.base import ToolCall
from open_instruct.agents.environments import make_environment
from open_instruct.extensions import registered_environments


@pytest.fixture(scope="module")
def service():
    with bash_code_service() as url:
        yield url


def new_env(url: str, **config):
    return make_environment("generic_sandbox", {"api_endpoint": url + "/execute", "timeout": 20, **config})


def play(env, *calls: tuple[str, dict], **reset):
    """reset, then each call in order, on one event loop; the step results."""

    async def run():
        await env.reset(**reset)
        return [await env.step(ToolCall(name, args)) for name, args in calls]

    return asyncio.run(run())


def bash(command: str) -> tuple[str, dict]:
    return ("execute_bash", {"command": command})


def edit(**args) -> tuple[str, dict]:
    return ("str_replace_editor", args)


def stdout(result) -> str:
    return result.result.split("[STDOUT]\n", 1)[1].split("\n[STDERR]\n", 1)[0]


def test_files_variables_and_the_directory_persist_between_the_steps_of_a_sample(service):
    first, second, third = play(
        new_env(service),
        bash("echo 'hi there' > notes.txt && mkdir -p pkg && cd pkg && export GREETING=hello && pwd && ls .."),
        bash("pwd; echo $GREETING; cat ../notes.txt"),
        bash("cd .. && ls -a && exit 3"),
    )
    root = stdout(first).splitlines()[0].removesuffix("/pkg")
    assert first.result.startswith("Exit code: 0\nExecution output of [execute_bash]:\n[STDOUT]\n")
    assert stdout(first).splitlines()[1:] == ["input", "notes.txt", "output", "pkg"]
    assert (first.reward, first.ok) == (0.0, True)
    assert stdout(second).splitlines() == [f"{root}/pkg", "hello", "hi there"]
    # A non-zero exit is the model's result, penalised but not a failed call; the state file never shows.
    assert third.result.startswith("Exit code: 3\n") and third.reward == -0.05 and third.ok
    assert stdout(third).split() == [".", "..", "input", "notes.txt", "output", "pkg"]


def test_the_editor_creates_views_and_edits_files_the_shell_then_runs(service):
    results = play(
        new_env(service),
        edit(command="create", path="calc/main.py", file_text="x = 6\nprint(x * 7)\n"),
        edit(command="str_replace", path="calc/main.py", old_str="x = 6", new_str="x = 7"),
        edit(command="insert", path="calc/main.py", insert_line=0, new_str="# the answer"),
        edit(command="view", path="calc/main.py"),
        edit(command="view", path="calc/main.py", view_range=[2, -1]),
        bash("python calc/main.py && pwd"),
        edit(command="view", path="."),
    )
    created, replaced, inserted, view, tail, ran, listing = results
    root = stdout(ran).splitlines()[1]
    assert created.result == f"Execution output of [str_replace_editor]:\nCreated {root}/calc/main.py."
    assert replaced.ok and inserted.ok and all(r.reward == 0.0 for r in results)
    assert view.result.endswith("     1\t# the answer\n     2\tx = 7\n     3\tprint(x * 7)")
    assert tail.result.endswith("\n     2\tx = 7\n     3\tprint(x * 7)") and "# the answer" not in tail.result
    assert stdout(ran).splitlines()[0] == "49"
    expected = [root, *(f"{root}/{name}" for name in ("calc", "calc/main.py", "input", "output"))]
    assert listing.result.splitlines()[1:] == expected


def test_absolute_paths_in_the_workspace_and_read_only_files_outside_it(service):
    env = new_env(service)

    async def run():
        await env.reset()
        root = stdout(await env.step(ToolCall(*bash("pwd")))).strip()
        calls = [
            edit(command="create", path=f"{root}/made.txt", file_text="absolute\n"),
            edit(command="view", path="/etc/passwd", view_range=[1, 1]),
            edit(command="create", path="/etc/evil", file_text="x"),
            bash("cat made.txt"),
        ]
        return [await env.step(ToolCall(name, args)) for name, args in calls]

    created, outside_view, outside_write, shown = asyncio.run(run())
    assert created.ok and stdout(shown) == "absolute\n"
    assert re.fullmatch(r"Execution output of \[str_replace_editor\]:\n     1\troot:.*", outside_view.result)
    assert outside_write.reward == -0.05 and "is outside the workspace" in outside_write.result


def test_editor_mistakes_are_errors_with_the_penalty(service):
    results = play(
        new_env(service, penalty=-0.5),
        edit(command="create", path="a.txt", file_text="one\none\n"),
        edit(command="create", path="a.txt", file_text="again"),
        edit(command="str_replace", path="a.txt", old_str="one", new_str="two"),
        edit(command="str_replace", path="a.txt", old_str="three", new_str="two"),
        edit(command="view", path="missing.txt"),
        edit(command="create", path="input", file_text="x"),
        edit(command="delete", path="a.txt"),
        ("run_python", {"code": "1"}),
    )
    messages = [r.result.split("ERROR: ", 1)[-1] for r in results[1:]]
    assert results[0].ok
    assert [r.reward for r in results[1:]] == [-0.5] * 7 and not any(r.ok for r in results[1:])
    assert messages[0].endswith("a.txt already exists; change it with str_replace or insert")
    assert messages[1].startswith("old_str occurs 2 times in ") and "does not occur" in messages[2]
    assert messages[3].endswith("missing.txt does not exist") and messages[4].endswith("input is a directory")
    assert "unknown command 'delete'" in messages[5] and "Unknown function 'run_python'" in messages[6]


def test_a_timeout_is_exit_124_and_keeps_what_the_command_wrote(service):
    timed, after = play(new_env(service, timeout=1), bash("echo before > t.txt; sleep 30"), bash("cat t.txt"))
    assert timed.result.startswith("Exit code: 124\n") and "Timed out after 1 s" in timed.result
    assert timed.reward == -0.05 and stdout(after) == "before\n"


def test_an_output_flood_stops_the_command_and_its_workspace_changes_are_lost_and_said_so(service):
    flood, after = play(new_env(service), bash("echo lost > gone.txt; yes | head -c 3000000"), bash("ls"))
    assert flood.result.startswith("Exit code: 137\n") and flood.reward == -0.05
    note = "[sandbox] output exceeded 1048576 bytes, so the command was stopped; its changes to the workspace are lost"
    assert note in flood.result
    assert stdout(after).split() == ["input", "output"]


def test_long_output_keeps_its_first_and_last_40_lines(service):
    [result] = play(new_env(service), bash("seq 1 200"))
    lines = stdout(result).splitlines()
    assert lines[:40] == [str(n) for n in range(1, 41)] and lines[-40:] == [str(n) for n in range(161, 201)]
    assert lines[40] == "[... 120 lines omitted ...]"


def test_samples_do_not_share_files_and_a_reset_starts_over(service):
    env, other = new_env(service), new_env(service)
    play(env, bash("echo mine > own.txt"))
    [seen] = play(other, bash("ls"))
    assert stdout(seen).split() == ["input", "output"]

    async def reset_and_list():
        await env.reset(task_prompt="Compute F(30)")
        return await env.step(ToolCall("execute_bash", {"command": "ls"}))

    assert stdout(asyncio.run(reset_and_list())).split() == ["input", "output"]
    prompt_env = new_env(service, write_prompt_file=True)
    [prompt] = play(prompt_env, bash("cat ~/prompt.txt"), task_prompt="Compute F(30)")
    assert stdout(prompt) == "Compute F(30)"


def test_the_sandbox_has_no_network_and_a_read_only_system(service):
    port = int(service.rsplit(":", 1)[1])
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
    [result] = play(new_env(service), bash(f'python -c "{probe}" 2>&1 | tail -1; touch /etc/x; id -u'))
    out, err = stdout(result), result.result.split("[STDERR]\n", 1)[1]
    assert "Error" in out.splitlines()[0] and "Read-only file system" in err and out.splitlines()[1] != "0"


def test_service_problems_are_error_observations_without_a_penalty():
    from helpers.processes import free_port

    env = new_env(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    [result] = play(env, bash("ls"))
    assert result.result.startswith("Sandbox error: the sandbox service is unreachable") and result.reward == 0.0
    assert not result.ok


def post_execute(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + "/execute", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"language": "ruby"}, "'language' must be python or bash"),
        ({"language": "bash", "workspace": "not base64!"}, "'workspace' is not base64"),
        ({"language": "bash", "workspace": "bm90IGd6aXA="}, "the workspace could not be unpacked"),
        ({"workspace": ""}, "'workspace' and 'shell_state' go with language bash"),
    ],
)
def test_bad_bash_requests_are_400_naming_the_problem(service, extra, message):
    status, reply = post_execute(service, {"code": "ls", "timeout": 5, **extra})
    assert status == 400 and message in reply["error"]


def test_a_service_without_kernel_layers_refuses_bash_and_reset_says_so():
    from code_server import SandboxConfig, code_server

    with code_server(config=SandboxConfig(kernel_isolation=False, allow_weak_sandbox=True)) as (_, url):
        status, reply = post_execute(url, {"code": "ls", "language": "bash", "timeout": 5})
        assert status == 400 and reply["error"].startswith("language bash needs /bin/bash and the kernel sandbox")
        with pytest.raises(ValueError, match="cannot run bash"):
            play(new_env(url))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"backend": "docker"}, "backend 'docker' is not available"),
        ({"image": "ubuntu:24.04"}, "'image' is a Docker setting"),
        ({"mem_limit": "8g"}, "start the code service with --memory_limit_mb"),
        ({"timeout": 300}, "'timeout' must be in (0, 45] seconds per command"),
        ({"memory": 1}, "--tool_configs for 'generic_sandbox': unknown key 'memory'"),
    ],
)
def test_bad_configs_are_one_line_errors(config, message):
    with pytest.raises(ValueError) as error:
        make_environment("generic_sandbox", config)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_it_is_registered_with_open_instructs_function_names_and_parses_as_a_tool():
    from open_instruct.config.core import parse_config

    names = [d.name for d in registered_environments()["generic_sandbox"].tool_definitions()]
    assert names == ["execute_bash", "str_replace_editor"]
    editor = registered_environments()["generic_sandbox"].tool_definitions()[1]
    assert set(editor.parameters["properties"]) == {
        "command",
        "path",
        "file_text",
        "old_str",
        "new_str",
        "insert_line",
        "view_range",
    }
    assert parse_config(["--tools", "generic_sandbox", "--tool_configs", '{"timeout": 10}']).tools.tools == [
        "generic_sandbox"
    ]


def test_a_command_that_makes_too_many_files_keeps_none_of_its_changes_and_says_so(service):
    _, many, listing = play(
        new_env(service),
        bash("echo kept > a.txt"),
        bash("echo lost > b.txt; mkdir many && cd many && seq 1 10001 | xargs touch && echo made"),
        bash("ls"),
    )
    assert stdout(many) == "made\n"
    assert "more than 10000 files, directories and links, so none of this command's changes" in many.result
    assert stdout(listing).split() == ["a.txt", "input", "output"]


def test_a_workspace_with_too_many_entries_is_refused_by_the_trainer_too():
    import io
    import tarfile

    from open_instruct.agents.sandbox_env import Workspace

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for i in range(10_001):
            tar.addfile(tarfile.TarInfo(f"f{i}"), io.BytesIO(b""))
    with pytest.raises(ValueError, match="more than 10000 entries"):
        Workspace.unpack(buffer.getvalue())


def test_packing_and_unpacking_leave_the_event_loop_free():
    """The loop runs other work while a workspace is packed and unpacked: a ticker task gets a turn before
    each returns (done inline, it could not)."""
    from open_instruct.agents.sandbox_env import SandboxEnv, Workspace, _Entry

    workspace = Workspace({f"f{i}": _Entry("file", b"x" * 100) for i in range(2000)})
    ticks: list[str] = []

    async def ticker():
        while True:
            ticks.append("tick")
            await asyncio.sleep(0)

    async def run():
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = len(ticks)
        text = await SandboxEnv.pack_workspace(workspace)
        packed = len(ticks)
        back = await SandboxEnv.unpack_workspace(text)
        unpacked = len(ticks)
        task.cancel()
        return before, packed, unpacked, back

    before, packed, unpacked, back = asyncio.run(run())
    assert before < packed < unpacked
    assert back.entries == workspace.entries


def test_a_command_cannot_make_namespaces_or_trace(service):
    [result] = play(new_env(service), bash("unshare -U true; echo user=$?; unshare -n true; echo net=$?"))
    assert stdout(result).splitlines() == ["user=1", "net=1"], result.result
    assert "Operation not permitted" in result.result
