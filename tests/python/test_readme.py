"""The README's Python examples run as written, and compute the right thing: each defines a
rank function; every rank of an epx.launch runs it, and what the ranks return is checked
against a dense torch computation of the same result (the checks of tests/docs/check_docs.py,
which also runs every other block of README.md and docs/getting-started.md as printed)."""
import os
import sys
import types

import pytest

import epx

sys.dont_write_bytecode = True  # nothing written into tests/docs
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "docs"))
import check_docs  # noqa: E402

BLOCKS = [b for b in check_docs.parse("README.md") if b.lang == "python"]


def test_readme_has_the_examples():
    names = {check_docs.rank_function(b.text)[0] for b in BLOCKS if check_docs.rank_function(b.text)}
    assert {"moe_step", "mean_grads"} <= names, f"README's Python blocks define {sorted(names)}"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"README.md:{b.line}")
def test_readme_python_block(block):
    found = check_docs.rank_function(block.text)
    assert found, f"README.md:{block.line}: no rank function with a check (tests/docs/check_docs.py PY_CHECKS)"
    func, ranks = found
    mod = types.ModuleType("readme_block")  # its __name__ is not "__main__": only the definitions run
    exec(compile(block.text, f"README.md:{block.line}", "exec"), mod.__dict__)
    why = check_docs.check_results(func, epx.launch(getattr(mod, func), ranks, start_method="fork"))
    assert why is None, why
