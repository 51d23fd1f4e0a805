"""`--preflight`: everything a launch checks before it starts Ray, then a short report; exit 0 or 2.

A 64-GPU script costs the cluster time before its first mistake shows: a misspelt template, a dataset
row the loader refuses, a tool whose key is not exported, a judge endpoint nobody started, 16 engines
on nodes of 8. Each of those is found here, on a laptop, in seconds: the flags and values are parsed
and validated exactly as a launch does; the model's tokenizer is loaded and the chat template renders
a prompt; the datasets are resolved, tokenized and length-filtered (the cache is used and filled as in
a launch); every tool and environment is built; every endpoint the run will call answers; and the
resource arithmetic (GPUs, nodes, steps, lookahead) is worked out. Nothing starts Ray, vLLM or
DeepSpeed.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from open_instruct.errors import UserError

# Nodes of this many GPUs are what open-instruct's clusters have; the arithmetic uses it as the node size.
GPUS_PER_NODE = 8
ENDPOINT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"  {'ok  ' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def run_checks(cfg) -> list[Check]:
    """Every preflight check in launch order; a failing check never hides the ones after it."""
    checks: list[Check] = []
    _guarded(checks, "GPU stack", _stack)
    tokenizer = _guarded(checks, "model and tokenizer", lambda: _tokenizer(cfg))
    if tokenizer is not None:
        _guarded(checks, "chat template", lambda: _render(cfg, tokenizer))
        prompts = _guarded(checks, "datasets", lambda: _datasets(cfg, tokenizer))
        if prompts is not None:
            _guarded(checks, "services of the data", lambda: _data_services(cfg, prompts))
    if cfg.model.use_peft:
        _guarded(checks, "LoRA adapter", lambda: _adapter(cfg))
    _guarded(checks, "tools and environments", lambda: _tools(cfg))
    _guarded(checks, "resources", lambda: _resources(cfg))
    return checks


def report(checks: list[Check]) -> str:
    failed = sum(not c.ok for c in checks)
    verdict = "ready to launch" if not failed else f"{failed} of {len(checks)} checks failed"
    return "\n".join(["preflight:", *(c.line() for c in checks), f"preflight: {verdict}"])


def _guarded(checks: list[Check], name: str, work):
    """Run one check; a user's error becomes a failed line, a returned (detail, value) a passed one."""
    try:
        detail, value = work()
    except (UserError, ValueError, OSError) as error:
        checks.append(Check(name, False, str(error).splitlines()[0]))
        return None
    checks.append(Check(name, True, detail))
    return value


def _stack():
    """The environment's torch/vLLM builds against this machine's GPUs and driver (what start-up checks)."""
    from open_instruct import stack_check

    if stack_check.skipped():
        return f"not checked ({stack_check.SKIP_ENV} is set)", None
    found, description = stack_check.check()
    if found:
        raise UserError("; ".join(found))
    return description, None


def _tokenizer(cfg):
    from open_instruct.data.models import check_model_sources, load_tokenizer

    check_model_sources(cfg.model)
    tokenizer = load_tokenizer(cfg.model)
    name = cfg.model.model_name_or_path or "the embedded default"
    return f"{name}, vocabulary {len(tokenizer)}", tokenizer


def _adapter(cfg):
    """--use_peft: the adapter's modules exist in the model (peft names any that do not), and what it weighs."""
    from open_instruct import adapters
    from open_instruct.config.derived import resolve_dtype
    from open_instruct.data.models import resolve_model_path

    dtype = resolve_dtype(cfg.model.dtype, cfg.model.model_dtype, on_gpu=True)  # the launch's, on GPUs
    return adapters.describe(resolve_model_path(cfg.model.model_name_or_path), cfg.model, dtype), None


def _render(cfg, tokenizer):
    """The template renders a system + user prompt, with the tool schemas when tools are configured."""
    from open_instruct.agents.settings import AgentSettings
    from open_instruct.agents.tools import Toolbox
    from open_instruct.data.rows import render_prompt

    messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 1 + 1?"}]
    tools = None
    if cfg.tools.tools and cfg.tools.pass_tools_to_chat_template:
        tools = [d.as_openai() for d in Toolbox(AgentSettings.from_config(cfg)).definitions()] or None
    text = render_prompt(tokenizer, messages, tools)
    tail = text[-40:].replace("\n", "\\n")
    with_tools = f", with {len(tools)} tool schema(s)" if tools else ""
    name = cfg.model.chat_template_name or "the tokenizer's own"
    return f"{name}{with_tools}: {len(text)} characters, ending {tail!r}", text


def _datasets(cfg, tokenizer):
    from open_instruct.data.dataset import load_split

    loaded = {which: load_split(cfg, tokenizer, which) for which in ("train", "eval")}  # no eval mix: none read
    lines = [loaded["train"].report.summary().splitlines()[0], cfg.evaluation_line]
    if cfg.eval_data is not None:
        lines.append(loaded["eval"].report.summary().splitlines()[0])
    return "; ".join(lines), loaded["train"].prompts + loaded["eval"].prompts


def _data_services(cfg, prompts):
    """The code service and the judge endpoint, when the data's verifiers call them."""
    from open_instruct.rewards import judge_base_url
    from open_instruct.rewards.code_tests import CODE_VERIFIERS, check_code_service

    verifiers = {name for prompt in prompts for name in prompt.verifier_names}
    called = []
    if verifiers & set(CODE_VERIFIERS):
        check_code_service(cfg.reward.code_api_url)
        called.append(f"code service {cfg.reward.code_api_url}")
    judges = sorted(v for v in verifiers if v.startswith("general-") or v == "rubric")
    if judges or cfg.reward.apply_evolving_rubric_reward:
        base = judge_base_url()
        if not base:
            raise UserError(f"verifiers {', '.join(judges)} need LLM_JUDGE_BASE_URL (or OPENAI_BASE_URL)")
        reach("the judge endpoint (LLM_JUDGE_BASE_URL)", base)
        called.append(f"judge endpoint {base}")
    return (", ".join(called) or f"none needed (verifiers: {', '.join(sorted(verifiers))})"), None


def _tools(cfg):
    """Build every tool and environment once and reach each endpoint a tool names."""
    from open_instruct.agents.environments import make_environment
    from open_instruct.agents.settings import tool_specs
    from open_instruct.agents.tools import make_tool
    from open_instruct.extensions import registered_tools

    specs = tool_specs(cfg.tools)
    if not specs:
        return "none configured", None
    built = []
    for spec in specs:
        if spec.kind in registered_tools():
            tool = make_tool(spec)
            for url in tool_endpoints(tool):
                reach(f"--tools {spec.kind}", url)
            built.append(f"{spec.call_name} ({spec.kind})")
        else:
            make_environment(spec.kind, {k: v for k, v in spec.config.items() if k != "pool_size"})
            built.append(f"{spec.kind} (environment)")
    return f"{', '.join(built)}; parser {cfg.tools.tool_parser_type}", None


def tool_endpoints(tool) -> list[str]:
    """The URLs a tool calls: its `endpoints()` when it declares them, else the URL keys of its settings."""
    if hasattr(tool, "endpoints"):
        return list(tool.endpoints())
    settings = getattr(tool, "settings", None)
    found = [getattr(settings, key, "") for key in ("api_endpoint", "url", "base_url", "api_url")]
    return [url for url in found if isinstance(url, str) and url.startswith(("http://", "https://"))]


def reach(what: str, url: str) -> None:
    """A TCP connection to the URL's host and port: whatever answers there is the run's to judge."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=ENDPOINT_TIMEOUT_S).close()
    except OSError as error:
        raise UserError(f"{what}: nothing answers at {url} ({type(error).__name__}: {error})") from None


def _resources(cfg):
    """GPUs and nodes the layout needs, checked against the placement rules on nodes of 8 GPUs."""
    from open_instruct.placement import ClusterShape, plan_placement

    generation, learner = cfg.generation, cfg.learner
    learners = list(learner.num_learners_per_node)
    engine_gpus = 0 if learner.single_gpu_mode else generation.vllm_num_engines * generation.vllm_tensor_parallel_size
    gpus = cfg.world_size + engine_gpus
    nodes = max(len(learners), math.ceil(gpus / GPUS_PER_NODE))
    plan_placement(
        ClusterShape(gpus_per_node=(GPUS_PER_NODE,) * nodes),
        generation.vllm_num_engines,
        generation.vllm_tensor_parallel_size,
        learners,
        single_gpu_mode=learner.single_gpu_mode,
        sync_backend=learner.vllm_sync_backend,
    )
    layout = (
        f"{cfg.world_size} learners ({' '.join(map(str, learners))} per node) + "
        f"{generation.vllm_num_engines} engines x tp {generation.vllm_tensor_parallel_size}"
        + (" sharing their GPUs" if learner.single_gpu_mode else "")
    )
    run = f"{cfg.num_training_steps} steps of {cfg.rollout_batch_size} samples, lookahead up to {cfg.lookahead_max}"
    return f"{layout} = {gpus} GPUs on >= {nodes} node(s) of {GPUS_PER_NODE}; {run}", None
