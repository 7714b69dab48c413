"""The shape of the code: every import points down, toward model.py and the ground floor (common.py)."""
import ast
import glob
import os

from conftest import ROOT

# the top floor: run, never imported by the project (scripts/ put the repository root on sys.path, so a sibling
# there would be imported by its bare name). data/prepare.py is both a script and the floor that the dataset
# scripts (data/*/prepare.py) stand on
SCRIPTS = {"train", "sample", "bench", "plot", "export", "eval"} | {
    os.path.basename(f)[:-3] for f in glob.glob(os.path.join(ROOT, "scripts", "*.py"))} | {
    os.path.relpath(f, ROOT)[:-3].replace(os.sep, ".") for f in glob.glob(os.path.join(ROOT, "data", "*", "prepare.py"))}


def project_imports() -> dict[str, set[str]]:
    """{file relative to ROOT: the project modules it imports}, for every .py outside tests/ and .venv/."""
    files = [f for f in glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)
             if not os.path.relpath(f, ROOT).startswith((f"tests{os.sep}", ".", f"config{os.sep}"))]
    modules = {os.path.relpath(f, ROOT)[:-3].replace(os.sep, ".") for f in files} | SCRIPTS
    graph = {}
    for f in files:
        names = set()
        for node in ast.walk(ast.parse(open(f, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        graph[os.path.relpath(f, ROOT)] = names & modules
    return graph


def test_no_file_imports_a_script():
    upward = {f: sorted(deps & SCRIPTS) for f, deps in project_imports().items() if deps & SCRIPTS}
    assert upward == {}


def test_model_and_common_stand_on_nothing_of_the_project():
    graph = project_imports()
    assert graph["model.py"] == set() and graph["common.py"] == set()


def test_the_import_graph_has_no_cycles():
    graph = {f[:-3].replace(os.sep, "."): deps for f, deps in project_imports().items()}
    done, active = set(), []

    def visit(module):
        assert module not in active, f"import cycle: {' -> '.join(active + [module])}"
        if module in done:
            return
        active.append(module)
        for dep in graph.get(module, ()):
            visit(dep)
        active.pop()
        done.add(module)

    for module in graph:
        visit(module)


def test_the_readme_s_files_table_names_each_file_s_project_imports():
    """Its last column: the modules it names (a parenthesis says when one is imported) are the imports, exactly."""
    import re
    graph = project_imports()
    modules = {f[:-3].replace(os.sep, ".") for f in graph}
    rows = [re.match(r"\| `([\w/]+\.py)` \|.*\| ([^|]*) \|$", line.strip())
            for line in open(os.path.join(ROOT, "README.md"), encoding="utf-8")]
    listed = {m.group(1): m.group(2) for m in rows if m and m.group(1) in graph}
    assert len(listed) >= 15
    for f, text in listed.items():
        assert set(re.findall(r"[\w.]+", text)) & modules == graph[f], f
