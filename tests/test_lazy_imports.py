"""`up` checks the task (prl_actors.tasks, prl_actors.model.tokenizer) before any actor starts: that
check must not import torch (~2-4 s on a busy host; the zygote imports it in parallel meanwhile)."""

from __future__ import annotations

import subprocess
import sys


def test_the_task_check_path_imports_no_torch_and_the_package_names_still_resolve() -> None:
    code = (
        "import sys\n"
        "import prl_actors.tasks, prl_actors.tasks.limits, prl_actors.model.tokenizer\n"
        "from prl_actors.model.tokenizer import build_tokenizer\n"
        "build_tokenizer()\n"
        "assert 'torch' not in sys.modules, 'torch imported by the task check'\n"
        "from prl_actors.model import load_model, load_tokenizer, prepare_model\n"
        "from prl_actors.model.builtin import load_model as home\n"
        "assert load_model is home and 'torch' in sys.modules\n"
        "import prl_actors.model as m\n"
        "assert {'load_model', 'load_tokenizer', 'prepare_model'} <= set(vars(m))\n"
        "try:\n"
        "    from prl_actors.model import no_such_name\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('a missing name imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
