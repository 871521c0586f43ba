"""The house's layering, read from the code's own imports: storelib's folders import only downwards,
storelib knows nothing of datasources, jobs or Spark, and datasources nothing of jobs."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# bottom up: a module may import from its own folder and any folder before it in this list
STORELIB_LAYERS = ["", "fileio", "format", "scan", "broker", "generator", "checks", "snapshot"]
# broker/'s rooms, bottom up: a room imports only from rooms before it here (rooms of one rank are apart)
BROKER_ROOMS = [("settings",), ("recovery", "index", "timer"), ("dispatch",), ("startup", "expiry", "writer"), ("replicas",)]
MAX_MODULES_PER_FOLDER = 16


def _imports(path: Path) -> list[str]:
    """Absolute module names a file imports (relative imports resolved against its package)."""
    pkg = list(path.relative_to(REPO).with_suffix("").parts[:-1])
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            mod = n.module or ""
            if n.level:
                base = pkg[: len(pkg) - (n.level - 1)]
                mod = ".".join(base + ([mod] if mod else []))
            out.append(mod)
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in STORELIB_LAYERS else ""


def test_storelib_folders_import_only_downwards():
    wrong = []
    for path in sorted((REPO / "storelib").rglob("*.py")):
        rel = path.relative_to(REPO)
        own = STORELIB_LAYERS.index(rel.parts[1] if len(rel.parts) > 2 else "")
        for mod in _imports(path):
            if mod.startswith("storelib.") and STORELIB_LAYERS.index(_layer(mod)) > own:
                wrong.append(f"{rel} imports {mod}")
    assert not wrong, "\n".join(wrong)


def test_storelib_knows_no_spark_and_nothing_of_ours_above_it():
    for path in sorted((REPO / "storelib").rglob("*.py")):
        for mod in _imports(path):
            assert mod.split(".")[0] not in ("datasources", "jobs", "pyspark", "py4j"), f"{path} imports {mod}"
    for path in sorted((REPO / "datasources").rglob("*.py")):
        for mod in _imports(path):
            assert mod.split(".")[0] != "jobs", f"{path} imports {mod}"


def test_every_storelib_folder_is_a_package_that_says_what_it_is():
    for d in sorted(p for p in (REPO / "storelib").iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = d / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), d


def _rank(room: str) -> int:
    return next(i for i, rank in enumerate(BROKER_ROOMS) if room in rank)


def test_broker_rooms_import_only_downwards():
    """The recovery walk sits below dispatch, the start-up replay (plan, apply, salvage) above it."""
    wrong = []
    known = {r for rank in BROKER_ROOMS for r in rank}
    for path in sorted((REPO / "storelib" / "broker").rglob("*.py")):
        rel = path.relative_to(REPO)
        if len(rel.parts) < 4:
            continue
        room = rel.parts[2]
        assert room in known, f"{rel}: room {room} is not in BROKER_ROOMS"
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[:2] == ["storelib", "broker"] and len(parts) > 3 and parts[2] != room:
                if _rank(parts[2]) >= _rank(room):
                    wrong.append(f"{rel} imports {mod}")
    assert not wrong, "\n".join(wrong)


def test_no_folder_holds_more_than_sixteen_modules():
    for top in ("storelib", "jobs", "datasources"):
        for d in [REPO / top, *(p for p in (REPO / top).rglob("*") if p.is_dir())]:
            if d.name == "__pycache__":
                continue
            mods = [f for f in d.glob("*.py") if f.name != "__init__.py"]
            assert len(mods) <= MAX_MODULES_PER_FOLDER, f"{d.relative_to(REPO)} holds {len(mods)} modules"


def test_every_subpackage_says_what_it_is():
    for top in ("storelib", "jobs"):
        for init in sorted((REPO / top).rglob("__init__.py")):
            if init.parent.parent == REPO:
                continue
            assert ast.get_docstring(ast.parse(init.read_text())), init.parent


def test_no_module_imports_a_private_name_of_another():
    """A name with a leading underscore is its module's own: another module that needs it gets a public one."""
    wrong = []
    for top in ("storelib", "jobs", "datasources"):
        for path in sorted((REPO / top).rglob("*.py")):
            for n in ast.walk(ast.parse(path.read_text())):
                if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in ("storelib", "jobs", "datasources"):
                    wrong += [f"{path.relative_to(REPO)}: {n.module}.{a.name}" for a in n.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert not wrong, "\n".join(wrong)


def _constants(tree: ast.AST) -> list[ast.Constant]:
    docs = {id(b.body[0].value) for b in ast.walk(tree)
            if isinstance(b, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and b.body and isinstance(b.body[0], ast.Expr) and isinstance(b.body[0].value, ast.Constant)}
    return [c for c in ast.walk(tree) if isinstance(c, ast.Constant) and id(c) not in docs]


def test_the_schedule_topic_and_the_default_delay_levels_are_defined_once():
    """One SCHEDULE_TOPIC (format.record) and one default delay table (format.delaylevel) in the library."""
    from storelib.format.delaylevel import DEFAULT_DELAY_LEVELS_MS

    topic_literals, tables = [], []
    for top in ("storelib", "jobs", "datasources"):
        for path in sorted((REPO / top).rglob("*.py")):
            tree = ast.parse(path.read_text())
            rel = str(path.relative_to(REPO))
            topic_literals += [rel for c in _constants(tree) if c.value == "SCHEDULE_TOPIC_XXXX"]
            for n in ast.walk(tree):
                if isinstance(n, (ast.Tuple, ast.List)) and len(n.elts) == len(DEFAULT_DELAY_LEVELS_MS) and all(
                        isinstance(e, ast.Constant) for e in n.elts):
                    if tuple(e.value for e in n.elts) == DEFAULT_DELAY_LEVELS_MS:
                        tables.append(rel)
    assert topic_literals == ["storelib/format/record.py"]
    assert tables == []  # the table is parsed from messageDelayLevel's default text, once


def test_which_transaction_types_get_a_consume_queue_unit_is_written_once():
    """CommitLogDispatcherBuildConsumeQueue's NOT/COMMIT rule is format.record.gets_cq_unit, which every
    dispatcher model (dispatch, rebuild, writer, start-up, expiry, the audits) calls instead of restating it."""
    import re

    from storelib.format.record import gets_cq_unit

    restated = re.compile(r"([\w.\[\]]+) == 0\) \| \(\1 == 2\)")
    where = [str(path.relative_to(REPO)) for top in ("storelib", "jobs", "datasources")
             for path in sorted((REPO / top).rglob("*.py")) if restated.search(path.read_text())]
    assert where == ["storelib/format/record.py"]
    assert [bool(gets_cq_unit(t)) for t in range(4)] == [True, False, True, False]  # NOT, PREPARED, COMMIT, ROLLBACK


def test_format_reads_consume_queue_files_and_the_broker_room_loads_them():
    """ConsumeQueue.recover and correctMinOffset are start-up rules: broker/settings/cqload, not format/."""
    from storelib.broker.settings.cqload import LoadedQueue
    from storelib.format import consumequeue

    for rule in ("recover", "max_offset", "max_physic_offset", "min_offset"):
        assert not hasattr(consumequeue.ConsumeQueue, rule) and hasattr(LoadedQueue, rule)
    for name in ("first_unit_from", "kept_after_truncation", "tags_code", "SCHEDULE_TOPIC", "DEFAULT_DELAY_LEVELS_MS"):
        assert not hasattr(consumequeue, name)
