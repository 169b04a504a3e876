"""The house in order: no import circle inside localchat (every concept imports only downward), and
the top-level command loads nothing but its option declarations (each subcommand loads its own)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "localchat"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, name: str, modules: set[str]) -> set[str]:
    """Every localchat module ``path`` imports, anywhere in it (functions and ``TYPE_CHECKING``
    blocks included: a circle of type hints is a circle of concepts), except its own ancestor
    packages, which Python loads before any of their modules anyway."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m in modules and m != name and not name.startswith(m + ".")}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imported(path, name, set(paths)) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``: its strongly connected components of more than one module
    (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_circle_of_three_and_not_a_line():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_of_localchat_is_part_of_an_import_circle():
    graph = import_graph()
    assert len(graph) > 50 and "localchat.conversation.turn" in graph["localchat.cli.chat"]
    assert cycles(graph) == []


def package_graph(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """``graph`` with each module folded into its package ``depth`` levels down (``localchat.serve``
    at 1, ``localchat.serve.pool`` at 2); a module above that depth stands for itself."""

    def folded(module: str) -> str:
        return ".".join(module.split(".")[:depth + 1])

    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        mine = folded(module)
        packages.setdefault(mine, set()).update(t for t in map(folded, targets) if t != mine)
    return packages


def test_the_package_folding_sees_a_circle_between_two_packages():
    graph = {"localchat.a.x": {"localchat.b.y"}, "localchat.b.y": set(), "localchat.b.z": {"localchat.a.w"},
             "localchat.a.w": set()}
    assert cycles(package_graph(graph, 1)) == [["localchat.a", "localchat.b"]]
    assert cycles(graph) == []


def test_no_package_of_localchat_imports_one_that_imports_it_back():
    """Packages too point one way (``mcp`` above ``tools``, ``serve.front`` above ``serve.apis``
    above ``serve.pool``): folded into their packages, the modules still make no circle."""
    graph = import_graph()
    for depth in (1, 2, 3):
        assert cycles(package_graph(graph, depth)) == [], depth


def test_the_top_level_command_loads_only_its_declarations():
    probe = ("import sys, localchat.cli.app; print(' '.join(m for m in sys.modules if m.split('.')[0] in "
             "('localchat', 'rich', 'httpx', 'mlx', 'mlx_lm', 'prompt_toolkit', 'yaml', 'jinja2')))")
    loaded = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
                 .stdout.split())
    assert "localchat.cli.chat_command" in loaded  # the declarations are there
    heavy = {m for m in loaded if m.split(".")[0] in ("rich", "httpx", "mlx", "mlx_lm", "prompt_toolkit", "yaml",
                                                      "jinja2")}
    assert heavy == set()
    assert not {"localchat.conversation.turn", "localchat.cli.chat", "localchat.registry"} & loaded


def every_command() -> list[list[str]]:
    """Every command's words (``["sessions", "show"]``), from the app's own tree."""
    import typer

    from localchat.cli.app import app

    def walk(group, words):
        for name, command in group.commands.items():
            yield [*words, name]
            if hasattr(command, "commands"):
                yield from walk(command, [*words, name])

    return list(walk(typer.main.get_command(app), []))


HEAVY = ("pydantic", "rich", "httpx", "mlx", "mlx_lm", "prompt_toolkit", "yaml", "jinja2")
HELP_PROBE = ("import sys; sys.argv = ['localchat', *sys.argv[1:], '--help']\nfrom localchat.cli import main\n"
              "try:\n    main()\nexcept SystemExit:\n    pass\n"
              f"print(' '.join(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}), file=sys.stderr)")


def test_every_subcommands_help_loads_only_declarations():
    """Each ``localchat COMMAND --help`` prints its help without pydantic (which Typer would load to
    coerce the group's unset ``--help``), MLX, httpx, Rich or prompt_toolkit (scripts/bench_help.py times it)."""
    from concurrent.futures import ThreadPoolExecutor

    commands = every_command()
    assert {"chat", "serve", "sessions show"} <= {" ".join(c) for c in commands}

    def loaded(words: list[str]) -> tuple[str, str, set[str]]:
        done = subprocess.run([sys.executable, "-c", HELP_PROBE, *words], capture_output=True, text=True, timeout=60)
        return done.stdout, " ".join(words), set(done.stderr.split())

    with ThreadPoolExecutor(4) as pool:
        for shown, name, heavy in pool.map(loaded, commands):
            typed = name.removesuffix(" run") if name == "bench run" else name  # (run is bench's default)
            assert "Usage:" in shown and f"localchat {typed} " in shown, name
            assert heavy == set(), name


MLX_STACK = ("mlx", "mlx_lm", "transformers", "numpy")


def test_the_http_client_starts_without_mlx():
    """``chat --backend server``, ``smoke`` and the gateway's modules send their first byte without
    importing MLX, mlx_lm or transformers (scripts/bench_http_start.py times launch to first request):
    a reply with a think block is still split by mlx_lm's own state machine, read from its source."""
    from fakeserver import FakeServer, Reply, delta, sse

    server = FakeServer()
    server.replies["/v1/chat/completions"] = Reply(chunks=sse(delta("<think>hmm</think>"), delta("Hi", "stop")))
    server.replies["/v1/models"] = Reply(
        chunks=[b'{"data": [{"id": "m"}]}'], headers={"Content-Type": "application/json"}
    )
    probe = ("import sys, runpy\nsys.argv = ['localchat', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('localchat', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "import localchat.serve.front.app, localchat.server.smoke\n"
             f"print('LOADED:', *(m for m in sys.modules if m.split('.')[0] in {MLX_STACK!r}), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, "chat", "--backend", "server", "--base-url", server.base_url,
                           "-m", "m", "--think", "hi"], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("Hi") and "<think>" not in done.stdout + done.stderr, done.stdout
    assert "think ~1" in done.stderr  # the reasoning was told apart and counted
    assert done.stderr.strip().splitlines()[-1] == "LOADED:", done.stderr
