"""The README's example runs as written, and its test command is the one CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README.md has no python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_ci_runs_the_readme_test_command():
    test_cmd = re.findall(r"&& (python -m pytest [^\n`]*)", README)
    assert len(test_cmd) == 1
    ci = (ROOT / ".ci" / "run").read_text()
    assert any(line.strip() == test_cmd[0] for line in ci.splitlines())
