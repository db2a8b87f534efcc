"""What importing the plugin loads: the ops without fairseq, and the models, tasks and criterions registered with
fairseq whichever of the two a process imports first. Each case runs in a fresh interpreter, so that sys.modules
holds only what its own imports loaded."""
import subprocess
import sys

import pytest

REGISTERED = """
import fairseq.criterions, fairseq.models, fairseq.tasks
assert "transformer_fw" in fairseq.models.MODEL_REGISTRY, sorted(fairseq.models.MODEL_REGISTRY)
assert "transformer_fw" in fairseq.models.ARCH_MODEL_REGISTRY
assert "transformer_fw_big" in fairseq.models.ARCH_MODEL_REGISTRY
assert "feedback_transformer_lm" in fairseq.models.MODEL_REGISTRY
assert "fw_lm_stream" in fairseq.tasks.TASK_REGISTRY
assert {"fw_attention_distillation", "fw_unlikelihood"} <= set(fairseq.criterions.CRITERION_REGISTRY)
"""


def python(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_ops_load_without_fairseq():
    python("import sys\nimport fw_fairseq.ops\nassert 'fairseq' not in sys.modules, 'fairseq was imported'\n"
           "assert not any(name.startswith('fw_fairseq.models') for name in sys.modules)")


@pytest.mark.parametrize("first, second", [
    ("fairseq", "fw_fairseq"),  # fairseq first (its CLIs, --user-dir): registered by the plugin's import
    # a plugin module imports fairseq first: registered once that module has finished
    ("fw_fairseq.models.checkpoints", "fairseq"),
    ("fw_fairseq.modules.fast_weight_attention", "fairseq"),
])
def test_the_models_are_registered_whichever_is_imported_first(first, second):
    python(f"import {first}\nimport {second}\n{REGISTERED}")


def test_the_plugin_first_registers_when_fairseq_is_imported_and_steps_aside():
    """The plugin first: looking for fairseq does not import it; importing it registers the models, and the hook
    then steps aside: fairseq's module and spec hold its own loader, and no hook of the plugin is left on the import
    path."""
    python("import importlib.machinery, importlib.util, sys\nimport fw_fairseq\n"
           "assert importlib.util.find_spec('fairseq') and 'fairseq' not in sys.modules\nimport fairseq.models\n"
           f"{REGISTERED}\nimport fairseq\n"
           "assert isinstance(fairseq.__loader__, importlib.machinery.SourceFileLoader), fairseq.__loader__\n"
           "assert fairseq.__spec__.loader is fairseq.__loader__\n"
           "assert not [f for f in sys.meta_path if type(f).__module__.startswith('fw_fairseq')]")
