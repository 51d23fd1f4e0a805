"""open-instruct's own launch scripts run here: every recorded command parses as written, preflights clean
on CPU after the substitutions of tests/helpers/launch_commands.py, and `--preflight` answers 0 or 2.

The commands are data (tests/data/open_instruct_launch_commands.json); the stand-in services are local:
an HTTP server that answers anything, our code-execution service, and environment variables holding
keys for the hosted tools (nothing is called with them in a preflight).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers.hub_datasets import offline_hub
from helpers.launch_commands import COMMANDS, DATA, REFUSED, flag_values, original, substitute

from open_instruct import grpo_fast
from open_instruct.config.core import ConfigError, parse_config
from open_instruct.grpo_fast import checked_config
from open_instruct.preflight import run_checks

TOOL_KEYS = {
    "SERPER_API_KEY": "test-serper-key",
    "JINA_API_KEY": "test-jina-key",
    "S2_API_KEY": "test-s2-key",
    "CRAWL4AI_API_KEY": "test-crawl4ai-key",
}


class _AnswersAnything(BaseHTTPRequestHandler):
    def _reply(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        body = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _reply

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def endpoints():
    from helpers.mcp_server import McpServerProcess

    from code_server import code_server

    web = ThreadingHTTPServer(("127.0.0.1", 0), _AnswersAnything)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{web.server_address[1]}"
    with code_server() as (_, code_url), McpServerProcess() as mcp:
        yield {"http": url, "code": code_url.removesuffix("/"), "mcp": f"http://127.0.0.1:{mcp.port}"}
    web.shutdown()


RUNNABLE = sorted(set(COMMANDS) - set(REFUSED))
NO_EVAL_LIST = sorted(script for script in RUNNABLE if "dataset_mixer_eval_list" not in flag_values(COMMANDS[script]))


@pytest.fixture
def tool_environment(monkeypatch, endpoints, tmp_path):
    for name, value in TOOL_KEYS.items():
        monkeypatch.setenv(name, value)
    blocklist = tmp_path / "blocklist.txt"
    blocklist.write_text("blocked.example\n")
    monkeypatch.setenv("CRAWL4AI_API_URL", endpoints["http"])
    monkeypatch.setenv("CRAWL4AI_BLOCKLIST_PATH", str(blocklist))
    monkeypatch.setenv("LLM_JUDGE_BASE_URL", endpoints["http"] + "/v1")
    monkeypatch.setenv("WANDB_MODE", "offline")


def test_the_record_covers_every_launch_script_of_open_instruct_that_it_can_run():
    assert len(COMMANDS) >= 27
    for entry in DATA["not_recorded"]:
        assert entry["reason"], entry["script"]
    # Every script of open-instruct's that names grpo_fast.py is either recorded or says why not (a name with a
    # space in it included).
    skipped = {entry["script"] for entry in DATA["not_recorded"]}
    assert len(COMMANDS) + len(skipped) == DATA["scripts_naming_grpo_fast"] and not skipped & set(COMMANDS)
    assert "scripts/train/rlvr/grpo_fast_mini copy.sh" in skipped
    # the scripts the parity issue names are among them
    for script in (
        "scripts/train/debug/envs/counter_1gpu.sh",
        "scripts/train/debug/tools/mcp_weather_debug.sh",
        "scripts/train/olmo3/7b_rlzero_math.sh",
        "scripts/train/dr-tulu/dr_tulu_qwen35.sh",
    ):
        assert script in COMMANDS


@pytest.mark.parametrize("script", sorted(REFUSED))
def test_the_dr_tulu_scripts_are_refused_in_one_line_with_the_reason(script, tool_environment):
    with pytest.raises(ConfigError, match=REFUSED[script]):
        checked_config(original(script))


@pytest.mark.parametrize("script", RUNNABLE)
def test_every_recorded_command_parses_as_written_and_its_layout_fits_nodes_of_8_gpus(script, tool_environment):
    from open_instruct.preflight import _resources

    cfg = checked_config(original(script))  # refused values and unknown names raise
    detail, _ = _resources(cfg)  # the script's own GPUs and nodes, not the CPU substitutes
    assert "GPUs on >=" in detail


@pytest.mark.parametrize("script", RUNNABLE)
def test_every_recorded_command_preflights_clean_on_cpu(script, tool_environment, endpoints, tmp_path):
    cfg = parse_config(substitute(script, tmp_path, endpoints))
    checks = run_checks(cfg)
    failed = [check.line() for check in checks if not check.ok]
    assert not failed, "\n".join(failed)
    assert {check.name for check in checks} >= {"model and tokenizer", "chat template", "datasets", "resources"}


def test_preflight_exits_0_with_a_report_and_2_naming_what_is_missing(
    tool_environment, endpoints, tmp_path, capsys, monkeypatch
):
    script = "scripts/train/debug/tools/qwen3_vllm_hermes_parser_debug.sh"
    argv = [*substitute(script, tmp_path, endpoints), "--preflight"]
    assert grpo_fast.main(argv) == 0
    out = capsys.readouterr().out
    assert "preflight: ready to launch" in out and "FAIL" not in out
    # The same script with its tool service gone: the report names the tool and the URL, exit 2.
    dead = [*substitute(script, tmp_path, {**endpoints, "http": "http://127.0.0.1:9", "code": "http://127.0.0.1:9"})]
    assert grpo_fast.main([*dead, "--preflight"]) == 2
    out = capsys.readouterr().out
    assert "FAIL" in out and "127.0.0.1:9" in out and "checks failed" in out


def test_seven_scripts_give_no_eval_list():
    assert len(NO_EVAL_LIST) == 7 and all(script.startswith("scripts/train/debug/envs/") for script in NO_EVAL_LIST)


@pytest.mark.parametrize("script", NO_EVAL_LIST)
def test_a_script_without_an_eval_list_preflights_clean_on_train_only_hub_data_and_evaluates_nothing(
    script, tool_environment, endpoints, tmp_path, monkeypatch
):
    # Its datasets keep their hub names and hold only `train`, as on the hub; asking for `test` would fail.
    hub = tmp_path / "hub"
    argv = substitute(script, tmp_path, endpoints, hub_cache=hub)
    offline_hub(monkeypatch, hub)
    cfg = parse_config(argv)
    checks = run_checks(cfg)
    failed = [check.line() for check in checks if not check.ok]
    assert not failed, "\n".join(failed)
    data = next(check.detail for check in checks if check.name == "datasets")
    assert "evaluation: none (no --dataset_mixer_eval_list" in data and "eval prompts" not in data
    assert cfg.eval_data is None
