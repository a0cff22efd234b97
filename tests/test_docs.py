# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The docs stay true: `[[autodoc]]` targets import, Python snippets compile, and the quick starts train offline."""

import ast
import glob
import importlib
import os
import re
import textwrap

import pytest


os.environ.setdefault("HF_HUB_OFFLINE", "1")

import trl  # noqa: E402
from trl.models.tiny import build_tiny_causal_lm  # noqa: E402
from trl.tasks import arithmetic_corpus  # noqa: E402


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_FILES = sorted(glob.glob(os.path.join(ROOT, "docs", "source", "*.md")))
SNIPPET_FILES = DOC_FILES + [os.path.join(ROOT, "README.md")]
PYTHON_BLOCK = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```", re.DOTALL | re.MULTILINE)
AUTODOC = re.compile(r"^\[\[autodoc\]\]\s+(\S+)[ \t]*\n((?:[ \t]+-[ \t]+\S+[ \t]*\n?)*)", re.MULTILINE)
MODEL_PLACEHOLDER = "path/to/causal-lm"


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def python_blocks(path: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, dedented source) of every ```python block in a markdown file."""
    text = _read(path)
    return [(text.count("\n", 0, m.start()) + 1, textwrap.dedent(m.group(2))) for m in PYTHON_BLOCK.finditer(text)]


def autodoc_targets() -> list[tuple[str, str, list[str]]]:
    """(file, target, members) for every `[[autodoc]] target` line, with its indented `- member` lines."""
    targets = []
    for path in DOC_FILES:
        for m in AUTODOC.finditer(_read(path)):
            members = re.findall(r"-[ \t]+(\S+)", m.group(2))
            targets.append((_rel(path), m.group(1), members))
    return targets


def resolve(target: str):
    """`GRPOConfig`, `trl.GRPOConfig` or `reference.ref_sync.sync_reference_model` → the object, relative to `trl`."""
    obj, module_path = trl, "trl"
    for part in target.removeprefix("trl.").split("."):
        if not hasattr(obj, part) and isinstance(obj, type(trl)):
            importlib.import_module(f"{module_path}.{part}")
        obj = getattr(obj, part)
        module_path = f"{module_path}.{part}"
    return obj


def test_docs_have_targets_and_snippets():
    assert DOC_FILES, "no docs/source/*.md found"
    assert len(autodoc_targets()) >= 4
    assert sum(len(python_blocks(p)) for p in SNIPPET_FILES) >= 5


@pytest.mark.parametrize("doc,target,members", [pytest.param(*t, id=f"{t[0]}:{t[1]}") for t in autodoc_targets()])
def test_autodoc_target_resolves(doc, target, members):
    try:
        obj = resolve(target)
    except (AttributeError, ImportError) as e:
        pytest.fail(f"{doc}: [[autodoc]] {target} does not resolve from `trl`: {e}")
    for member in members:
        assert hasattr(obj, member), f"{doc}: [[autodoc]] {target} lists member {member!r}, which it does not have"
    assert obj.__doc__, f"{doc}: [[autodoc]] {target} has no docstring to render"


@pytest.mark.parametrize(
    "path,line,source",
    [pytest.param(p, line, src, id=f"{_rel(p)}:{line}") for p in SNIPPET_FILES for line, src in python_blocks(p)],
)
def test_python_snippet_compiles(path, line, source):
    compile(source, f"{_rel(path)}:{line}", "exec")


def quick_start(path: str) -> str:
    """The python block of `path` that builds a `GRPOTrainer` on the placeholder model and trains it."""
    blocks = [src for _, src in python_blocks(path) if MODEL_PLACEHOLDER in src and ".train()" in src]
    assert len(blocks) == 1, f"{_rel(path)} should have exactly one quick-start block using {MODEL_PLACEHOLDER!r}"
    return blocks[0]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("docs_model")), corpus=arithmetic_corpus())


@pytest.mark.parametrize("doc", ["docs/source/grpo_trainer.md", "README.md"])
def test_quick_start_runs_offline(doc, tiny_model, tmp_path):
    source = quick_start(os.path.join(ROOT, doc))
    # Two explicit substitutions: the placeholder model becomes a local tiny model, and the one GRPOConfig(...) call
    # goes through `_shrink`, which keeps the snippet's own arguments but overrides those that make the run
    # small, CPU-only and local.
    assert source.count("GRPOConfig(") == 1, f"{doc}: expected one GRPOConfig(...) call in the quick start"
    source = source.replace(MODEL_PLACEHOLDER, tiny_model).replace("GRPOConfig(", "_shrink(GRPOConfig)(")

    def _shrink(config_cls):
        def make(*args, **kwargs):
            kwargs.update(
                output_dir=str(tmp_path / "out"),
                max_steps=2,
                per_device_train_batch_size=kwargs.get("num_generations", 8),  # one prompt per step
                max_completion_length=4,
                logging_steps=1,
                save_strategy="no",
                use_cpu=True,
                bf16=False,
                gradient_checkpointing=False,
                report_to="none",
                disable_tqdm=True,
            )
            return config_cls(*args, **kwargs)

        return make

    namespace = {"__name__": "docs_quick_start", "_shrink": _shrink}
    exec(compile(source, f"{doc}:quick-start", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2
    assert trainer.args.max_steps == 2 and trainer.args.output_dir == str(tmp_path / "out")
    # the snippet's own iterative-GRPO settings survived the shrinking
    assert trainer.args.sync_ref_model is True and trainer.args.ref_model_sync_steps == 64
    assert trainer.sync_callback in trainer.callback_handler.callbacks
    assert all("reward" in h for h in trainer.state.log_history[:2])


def _trl_imports(path: str) -> set[str]:
    """The modules of `trl` that the module at `path` imports (at the top or inside a function), as paths relative to
    the root; importing a package counts as importing what its `__init__.py` imports."""
    module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    package = module.rsplit(".", 1)[0] if not module.endswith(".__init__") else module[: -len(".__init__")]
    targets = set()
    for node in ast.walk(ast.parse(_read(path))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            targets |= {target} | {f"{target}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
    found = set()
    for target in targets:
        as_path = target.replace(".", "/")
        if os.path.isfile(os.path.join(ROOT, as_path + ".py")):
            found.add(as_path + ".py")
        elif os.path.isfile(os.path.join(ROOT, as_path, "__init__.py")) and target != module:
            found |= _trl_imports(os.path.join(ROOT, as_path, "__init__.py"))
    return found


def test_contributing_maps_every_module_in_layer_order():
    """CONTRIBUTING.md's "Where things go" has one line per module of `trl/` (package `__init__.py` files aside), names
    no other, and lists them bottom-up: every module imports only modules listed above it, so there is no cycle."""
    text = _read(os.path.join(ROOT, "CONTRIBUTING.md"))
    section = text[text.index("## Where things go") : text.index("## Tests")]
    listed = re.findall(r"^- `(trl/[\w/]+\.py)`:", section, re.MULTILINE)
    modules = sorted(
        os.path.relpath(p, ROOT).replace(os.sep, "/")
        for p in glob.glob(os.path.join(ROOT, "trl", "**", "*.py"), recursive=True)
        if os.path.basename(p) != "__init__.py"
    )
    assert sorted(listed) == modules
    assert len(listed) == len(set(listed))
    for position, module in enumerate(listed):
        imported = _trl_imports(os.path.join(ROOT, module)) - {module}
        assert imported <= set(listed[:position]), (module, sorted(imported - set(listed[:position])))
