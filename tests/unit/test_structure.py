"""The package's shape stays what the README promises: an acyclic import graph, floors imported only
downwards (core < actors < driver handles < loop < entry < benchmarks), pure numeric and scheduling modules,
Ray waits only in the driver-side handles, and classes and functions that fit in a reading. The benchmarks
sit beside the package (`benchmarks/`) under the same rules, as its top floor: they may use any of it, and
nothing in it uses them. Imports inside functions count (a lazy import is still a dependency); imports under
`if TYPE_CHECKING:` count only for cycles (they never run, but two modules that name each other's types are
still one subject split in two)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "open_instruct"
BENCHMARKS = REPO / "benchmarks"
SOURCES = (PACKAGE, BENCHMARKS)  # what the rules below hold for
OURS = {source.name for source in SOURCES}

# Pure logic: no Ray, vLLM or DeepSpeed, and not the actors that own them, so each is tested on a
# CPU in-process and reused by the simulator.
PURE = (
    "advantages",
    "loss",
    "packing",
    "replay_buffer",
    "prompt_feeder",
    "messages",
    "config",
    "metrics",
    "batching",
    "rewards",
    "pacing",
    "agents.base",
    "agents.parsers",
    "agents.environments",
    "agents.settings",
    "agents.tools",
    "agents.rollout",
    "data.rows",
    "generation.ledger",
    "generation.faults",
)
FORBIDDEN_FOR_PURE = {"ray", "vllm", "deepspeed", "open_instruct.generation.actor", "open_instruct.learner.actor"}

# The floors of the house, lowest first: a module imports only from its own floor or below. Every module
# not named here is on the core floor (pure logic, configuration, data, rewards, agents, messages).
ACTORS = {
    "generation.actor",
    "generation.engine_setup",
    "generation.engine_state",
    "generation.outputs",
    "generation.channels",
    "generation.sample_requests",
    "generation.weight_receive",
    "learner.actor",
    "learner.deepspeed_setup",
    "learner.policy_weights",
    "learner.sequence_parallel",
    "learner.weight_sender",
    "weights.gloo",
    "weights.gloo_engine",
    "weights.nccl",
    "weights.nccl_engine",
    "weights.shm",
    "weights.shm_engine",
    "weights.ipc",
    "weights.ipc_engine",
    "weights.reload",
    "weights.adapter_engine",
    "weights.watchdog",
    "weights.shm_sweep",
}
# The only modules that wait on actors: the driver-side handles (and the cluster that builds them).
HANDLES = {"generation.pool", "generation.replacement", "learner.group", "weights.sync", "cluster"}
LOOP = {"orchestrator"}
ENTRY = {"grpo_fast", "preflight"}
FLOORS = ("core", "actors", "driver handles", "loop", "entry", "benchmarks")
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 620  # about 600: a longer module has more than one job (the benchmarks included)


def floor(module: str) -> int:
    if module.split(".")[0] == BENCHMARKS.name:
        return FLOORS.index("benchmarks")
    name = module.removeprefix("open_instruct.")
    for level, members in enumerate((ACTORS, HANDLES, LOOP, ENTRY), start=1):
        if any(name == m or name.startswith(m + ".") for m in members):
            return level
    return 0


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> list[Path]:
    return [path for source in SOURCES for path in sorted(source.rglob("*.py"))]


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sources()}


def _nodes(tree: ast.AST, type_checking: bool = False):
    """Every node, but those under `if TYPE_CHECKING:` only with `type_checking`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, known: set[str], type_checking: bool = False) -> set[str]:
    """Modules `name` imports: our modules by full name, third-party packages by top-level name."""
    found = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in _nodes(ast.parse(path.read_text()), type_checking):
        if isinstance(node, ast.Import):
            found |= {alias.name if alias.name in known else alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: strip (level - 1) trailing parts of the importing package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:  # `from package import module` imports the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    # Our modules by their full name; a third-party import by its top-level package (`vllm.config` is `vllm`).
    return {(_owner(m, known) if m.split(".")[0] in OURS else m.split(".")[0]) if m not in known else m for m in found}


def _owner(name: str, known: set[str]) -> str:
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def graph(type_checking: bool = False) -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known, type_checking) - {name} for name, path in mods.items()}


def _cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of the directed graph `edges` (node -> nodes it imports), or []."""
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycle.extend(path[path.index(dep) :] + [dep] if dep in path else [node, dep])
                return True
            if dep not in state and visit(dep, [*path, dep]):
                return True
        state[node] = 2
        return False

    for node in sorted(edges):
        if node not in state and visit(node, [node]):
            break
    return cycle


def test_the_import_graph_has_no_cycles():
    """Type-only imports included: a module that formats another's results and is imported by it for that
    (the simulator's projection and its tables once were) is a circle whatever `TYPE_CHECKING` hides."""
    full = graph(type_checking=True)
    edges = {m: {d for d in deps if d in full} for m, deps in full.items()}
    assert not (cycle := _cycle(edges)), " -> ".join(cycle)


def test_no_subpackage_and_top_level_module_import_each_other():
    """Between the package's parts (a top-level module, a subpackage as one) arrows point one way: a part that
    imports another is above it, and nothing of the lower part imports it back (the names both sides share live
    below both, as `weights.adapter_names` does for `adapters` and the engines' adapter updates)."""
    g = graph()
    part = {m: ".".join(m.split(".")[:2]) for m in g}
    edges: dict[str, set[str]] = {p: set() for p in part.values()}
    for module, deps in g.items():
        edges[part[module]] |= {part[d] for d in deps if d in part and part[d] != part[module]}
    assert not (cycle := _cycle(edges)), " -> ".join(cycle)


def test_pure_modules_never_reach_ray_vllm_deepspeed_or_the_actors():
    g = graph()
    for pure in PURE:
        name = f"open_instruct.{pure}"
        roots = [m for m in g if m == name or m.startswith(name + ".")]
        assert roots, f"{name} does not exist"
        seen, todo = set(), list(roots)
        while todo:  # transitively: a pure module must not import one that imports Ray
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            todo.extend(d for d in g.get(current, ()) if d.startswith("open_instruct"))
        reached = {dep for module in seen for dep in g[module]} & FORBIDDEN_FOR_PURE
        assert not reached, f"{name} reaches {sorted(reached)}"


def test_only_the_driver_side_handles_wait_on_ray():
    for name, path in modules().items():
        calls = [
            node.lineno
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute)
            and node.attr in ("get", "wait")
            and isinstance(node.value, ast.Name)
            and node.value.id == "ray"
        ]
        if name.removeprefix("open_instruct.") not in HANDLES:
            assert not calls, f"{path.relative_to(REPO)} waits on Ray at lines {calls}; go through a handle"


def test_the_orchestrator_does_not_import_ray():
    assert not {"ray", "vllm", "deepspeed"} & graph()["open_instruct.orchestrator"]


def test_each_floor_imports_only_from_its_own_floor_or_below():
    """core < actors < driver handles < loop < entry: an actor never reaches a driver handle, the loop never
    reaches the entry point, and pure code never reaches either."""
    upward = [
        f"{module} ({FLOORS[floor(module)]}) imports {dep} ({FLOORS[floor(dep)]})"
        for module, deps in graph().items()
        for dep in deps
        if dep.split(".")[0] in OURS and floor(dep) > floor(module)
    ]
    assert not upward, "\n".join(upward)


def test_nothing_we_ship_or_measure_imports_the_tests():
    """Test doubles (fault-injection engines, forced turns, fakes) live in tests/helpers; the package and the
    benchmarks never reach for them."""
    reaching = [
        f"{module} imports {dep}"
        for module, deps in graph(type_checking=True).items()
        for dep in deps
        if dep.split(".")[0] in ("tests", "helpers", "conftest")
    ]
    assert not reaching, "\n".join(reaching)


def test_configuration_is_the_ground_floor():
    """config/ imports nothing of ours but errors and itself: checks that need a registry, a tokenizer, a
    dataset or an installed package run at launch (grpo_fast.launch_problems, preflight), and the rules a
    parsed policy sets (the staleness window, the age rule) live above it and read it."""
    allowed = {"open_instruct.errors"}
    reaching = [
        f"{module} imports {dep}"
        for module, deps in graph().items()
        if module.startswith("open_instruct.config")
        for dep in deps
        if dep.startswith("open_instruct") and not dep.startswith("open_instruct.config") and dep not in allowed
    ]
    assert not reaching, "\n".join(reaching)


def test_the_runtime_never_reads_the_compatibility_group():
    """cfg.compat holds open-instruct's flags that do nothing here; only configuration and the entry point
    (which refuses and warns) may read it."""
    readers = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in sources()
        if path.parent.name != "config" and path.stem != "grpo_fast"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "compat"
    ]
    assert not readers, "\n".join(readers)


def test_every_floor_is_populated_by_existing_modules():
    """The floor lists name real modules (a renamed module would otherwise slip onto the core floor)."""
    names = {m.removeprefix("open_instruct.") for m in modules()}
    for members in (ACTORS, HANDLES, LOOP, ENTRY):
        for member in members:
            assert any(n == member or n.startswith(member + ".") for n in names), f"{member} does not exist"


def test_subpackages_hold_only_a_map_in_their_init():
    """Importing `open_instruct.learner.group` on the driver must not import DeepSpeed through the package."""
    for init in [*PACKAGE.glob("*/__init__.py"), BENCHMARKS / "__init__.py"]:
        tree = ast.parse(init.read_text())
        if init.parent.name in ("config", "data", "generation", "learner", "weights", "benchmarks"):
            assert ast.get_docstring(tree), f"{init.relative_to(REPO)} has no map of its package"
            assert len(tree.body) == 1, f"{init.relative_to(REPO)} holds code; it should only map the package"


def test_classes_and_functions_fit_in_a_reading():
    too_long = []
    for path in [*sources(), *(REPO / "code_server").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            length = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, ast.ClassDef) and length > MAX_CLASS_LINES:
                too_long.append(f"{path.relative_to(REPO)}:{node.lineno} class {node.name}: {length} lines")
            is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_function and length > MAX_FUNCTION_LINES and node.name not in ("parse_args", "build_parser"):
                too_long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}(): {length} lines")
    assert not too_long, "\n".join(too_long)


def test_no_module_of_the_package_is_longer_than_a_few_readings():
    lengths = {path: len(path.read_text().splitlines()) for path in sources()}
    long = [f"{path.relative_to(REPO)}: {n} lines" for path, n in lengths.items() if n > MAX_MODULE_LINES]
    assert not long, "split these by what they do:\n" + "\n".join(long)


def test_the_graph_sees_lazy_imports_and_package_imports():
    """The checks above are only as good as the import parser: it must see what actually runs."""
    g = graph()
    assert "open_instruct.learner.actor" in g["open_instruct.cluster"]  # imported inside a function
    assert "open_instruct.checkpoints" in g["open_instruct.orchestrator"]  # `from open_instruct import checkpoints`
    assert "ray" in g["open_instruct.generation.pool"]
    assert "benchmarks.simulation" not in g["benchmarks.simulator_plots"]  # under TYPE_CHECKING
    assert "benchmarks.simulation" in graph(type_checking=True)["benchmarks.simulator_plots"]
    assert "open_instruct.orchestrator" in g["benchmarks.e2e_runs"]  # the benchmarks' imports of the package


def test_test_files_share_code_through_helpers_never_through_each_other():
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [
                f"{path.relative_to(REPO)} imports {n}" for n in names if n.split(".")[-1].startswith("test_")
            ]
    assert not offenders, "\n".join(offenders)


CONFIG_HOLDERS = {"cfg", "config", "self.cfg", "self.config", "settings", "self.settings"}


def test_no_squeezing_no_fmt_skip_and_no_short_aliases_of_configuration():
    """A flag keeps its name where it is used: `generation.temperature`, not `g.temperature`; and code is
    formatted like all other code (`# fmt: skip` hides length, it does not remove it)."""
    found = []
    for path in [*sources(), *(REPO / "tests").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]:
        text = path.read_text()
        if path.name == "test_structure.py":
            continue  # this file names the marker it looks for
        found += [
            f"{path.relative_to(REPO)}:{i} fmt: skip"
            for i, line in enumerate(text.splitlines(), 1)
            if "fmt: skip" in line
        ]
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target, value = node.targets[0], node.value
            pairs = (
                zip(target.elts, value.elts)
                if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                else [(target, value)]
            )
            for name, source in pairs:
                short = isinstance(name, ast.Name) and len(name.id) <= 2
                if short and isinstance(source, ast.Attribute) and ast.unparse(source.value) in CONFIG_HOLDERS:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {name.id} = {ast.unparse(source)}")
    assert not found, "\n".join(found)


def test_the_longest_first_order_names_existing_test_files():
    from conftest import LONGEST_FIRST

    missing = [name for name in LONGEST_FIRST if not (REPO / "tests" / "integration" / name).is_file()]
    assert not missing and len(set(LONGEST_FIRST)) == len(LONGEST_FIRST), missing


def _slow_marks(path: Path) -> list[int]:
    """Lines of `pytest.mark.slow` (or `mark.slow`) in a file."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr == "slow"
        and (
            (isinstance(node.value, ast.Attribute) and node.value.attr == "mark")
            or (isinstance(node.value, ast.Name) and node.value.id == "mark")
        )
    ]


def test_a_test_files_folder_is_its_tier():
    """tests/unit: pure code and the loop on in-process fakes; tests/integration: the real stack, every test of
    it `slow` by tests/conftest.py; tests/nightly: real-stack runs too long for CI, `slow` and `nightly`. So each
    test file sits in one of the three folders, they hold test files only (shared code is in tests/helpers), no
    file marks itself slow, and module names are unique (pytest imports a test file by its basename)."""
    from conftest import is_integration, is_nightly

    tests = REPO / "tests"
    unit, integration, nightly = tests / "unit", tests / "integration", tests / "nightly"
    test_files = sorted(tests.rglob("test_*.py"))
    stray = set(test_files) ^ {*unit.rglob("*.py"), *integration.rglob("*.py"), *nightly.rglob("*.py")}
    assert not stray, (
        f"test files belong in tests/unit, tests/integration or tests/nightly, and only they: {sorted(stray)}"
    )
    assert {path.parent for path in test_files} == {unit, integration, nightly}  # no subfolders
    assert all(is_integration(path) == (path.parent == integration) for path in test_files)
    assert all(is_nightly(path) == (path.parent == nightly) for path in test_files)
    names = [path.name for path in test_files]
    assert len(set(names)) == len(names), sorted(name for name in names if names.count(name) > 1)
    marked = []
    for path in sorted(tests.rglob("*.py")):
        if path.name != "conftest.py":
            marked += [f"{path.relative_to(REPO)}:{line}" for line in _slow_marks(path)]
    assert not marked, "the folder is the tier: move a slow test to tests/integration\n" + "\n".join(marked)


# Private names of other libraries the package reads, each for a reason documented where it is read.
THIRD_PARTY_PRIVATES = {
    "os._exit",  # end a process at once, without cleanup (a killed engine, a forked worker)
    "parser._actions",  # argparse: the flags a parser defines
    "model.config._attn_implementation",  # transformers: the attention kernel it chose
    "WeightTransferEngineFactory._registry",  # vLLM: our transports registered as its engines
    "module._parameters",  # torch: a layer's parameters swapped in place during a reload
    "dataset._fingerprint",  # datasets: a loaded table's content hash, recorded to see a hub revision change
}


def _names_defined(tree: ast.AST) -> set[str]:
    defined = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            defined.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
    return defined


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reads(path: Path) -> list[str]:
    """The private names of other files that `path` reads: `module._PRIVATE`, `self._x` it never assigns,
    `from module import _PRIVATE` (relative or not) and `getattr(x, "_PRIVATE")`."""
    tree = ast.parse(path.read_text())
    defined = _names_defined(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found += [
                f"{node.lineno} from {module} import {alias.name}"
                for alias in node.names
                if _is_private(alias.name) and f"{module}.{alias.name}" not in THIRD_PARTY_PRIVATES
            ]
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            if node.attr not in defined and ast.unparse(node) not in THIRD_PARTY_PRIVATES:
                found.append(f"{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and _is_private(name.value):
                read = f"{ast.unparse(node.args[0])}.{name.value}"
                if name.value not in defined and read not in THIRD_PARTY_PRIVATES:
                    found.append(f"{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_reads_a_private_name_defined_in_another_file():
    """A class spread over files (mixins reading each other's `self._x`) or a module reaching into another's
    `_PRIVATE` (as `module._PRIVATE` or `from module import _PRIVATE`) hides a dependency: what is shared is
    declared and public (the engine actor's `EngineState`). The benchmarks too: they use the package through
    its public names."""
    found = [f"{path.relative_to(REPO)}:{read}" for path in sources() for read in private_reads(path)]
    assert not found, "\n".join(found)


def test_the_private_name_check_sees_every_way_of_reading_one(tmp_path):
    source = tmp_path / "reader.py"
    source.write_text(
        "from open_instruct.learner.logprobs import _chunk, public\n"
        "from . import _sibling\n"
        "import os\n"
        "value = os.path._joinrealpath\n"
        "other = getattr(public, '_hidden')\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._own = getattr(self, '_own', 0)\n"
        "        os._exit\n"
    )
    assert private_reads(source) == [
        "1 from open_instruct.learner.logprobs import _chunk",
        "2 from . import _sibling",
        "4 os.path._joinrealpath",
        "5 getattr(public, '_hidden')",
    ]


def test_the_engine_actor_has_no_mixins():
    tree = ast.parse((PACKAGE / "generation" / "actor.py").read_text())
    actor = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GenerationActor")
    assert actor.bases == []
