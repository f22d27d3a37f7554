"""The tree shows the architecture: packages point one way and nothing imports in a circle.

    base/method -> base/config -> base/hf -> base/runtime -> base/eval -> base/run
A module may import from its own package and from the packages before it; the shared modules
(base/checks.py, files.py, registry.py, progress.py) and kernels/ import nothing from base/. Imports are read
from the source (every `import`, also inside functions), so a lazy import counts too.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["shared", "method", "config", "hf", "runtime", "eval", "run"]
SHARED = {"base.checks", "base.files", "base.registry", "base.progress", "base"}


def layer(module: str) -> str | None:
    if module in SHARED:
        return "shared"
    if module == "base.config":
        return "config"
    parts = module.split(".")
    return parts[1] if parts[0] == "base" and len(parts) > 2 else None


def imports(path: Path, package: str) -> set[str]:
    """Modules of this repository that `path` imports, resolved to module names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in ("base", "kernels", "tools") and module_path(m)}


def module_path(module: str) -> Path | None:
    p = ROOT / Path(*module.split("."))
    if p.with_suffix(".py").exists():
        return p.with_suffix(".py")
    return p / "__init__.py" if (p / "__init__.py").exists() else None


def graph() -> dict[str, set[str]]:
    out = {}
    for top in ("base", "kernels"):
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            package = name if rel.name == "__init__" else name.rsplit(".", 1)[0]
            out[name] = {m for m in imports(path, package) if m != name and not name.startswith(m + ".")}
    return out


def test_packages_point_one_way():
    bad = []
    for mod, deps in graph().items():
        for dep in deps:
            if mod.startswith("kernels"):
                if dep.startswith("base"):
                    bad.append(f"{mod} -> {dep} (kernels/ takes plain tensors and imports nothing from base/)")
                continue
            a, b = layer(mod), layer(dep)
            if dep.startswith(("tools",)):
                bad.append(f"{mod} -> {dep} (base/ never imports the tooling)")
            elif a is not None and b is not None and ORDER.index(b) > ORDER.index(a):
                bad.append(f"{mod} ({a}) -> {dep} ({b})")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    g = graph()
    # Tarjan's strongly connected components; any component of more than one module is a cycle
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(comp)

    for v in g:
        if v not in index:
            visit(v)
    cycles = [sorted(c) for c in comps if len(c) > 1]
    assert not cycles, cycles


def test_hydra_is_read_only_at_the_entry_points():
    users = [str(p.relative_to(ROOT)) for top in ("base", "kernels") for p in (ROOT / top).rglob("*.py")
             if any(m.split(".")[0] in ("hydra", "omegaconf") for m in _all_imports(p))]
    assert users == []


def _all_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_every_package_says_what_it_owns():
    for pkg in ("method", "hf", "runtime", "eval", "run"):
        doc = ast.get_docstring(ast.parse((ROOT / "base" / pkg / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 15, f"base/{pkg}/__init__.py needs a docstring saying what it owns"


@pytest.mark.slow
def test_the_speed_stages_import_without_lm_eval_or_wandb():
    """A GPU host may have neither (the throughput and serving stages need neither): every module
    those stages load imports with both blocked; lm-eval is imported only where it is used."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['lm_eval'] = None; sys.modules['wandb'] = None\n"
            "import run, base.run.pipeline, base.run.preflight, base.run.context_checks, base.runtime.engine\n")
    res = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_run_py_imports_without_torch_or_pandas():
    """A command line Hydra cannot compose is refused before torch or pandas load (a fraction of a
    second, not two): run.py's module imports, the config schema included, need neither."""
    import subprocess
    import sys

    code = "import sys, run\nprint(sorted(m for m in ('torch', 'pandas') if m in sys.modules))\n"
    res = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr[-2000:]
