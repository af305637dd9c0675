"""python -m posenc extrapolate: argument errors, and a tiny end-to-end run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from posenc.lab.cli import main

BAD = [
    (["extrapolate", "--schemes", "rope,absolute"], "unknown scheme 'absolute'"),
    (["extrapolate", "--eval-lens", "64,0"], "must be >= 1"),
    (["extrapolate", "--eval-lens", "-5"], "must be >= 1"),
    (["extrapolate", "--steps", "10.5"], "must be an integer"),
    (["extrapolate", "--steps", "ten"], "must be an integer"),
    (["extrapolate", "--steps", "0"], "must be >= 1"),
    (["extrapolate", "--seeds", "0,x"], "must be an integer"),
    (["extrapolate", "--train-len", "0"], "must be >= 1"),
    (["extrapolate", "--no-such-flag"], "unrecognized arguments"),
    ([], "required"),
]


@pytest.mark.parametrize(("argv", "message"), BAD)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_bad_arguments_in_a_real_process():
    proc = subprocess.run(
        [sys.executable, "-m", "posenc", "extrapolate", "--schemes", "sinusoidal,wrong"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "python -m posenc extrapolate: error: argument --schemes: unknown scheme 'wrong'; "
        "allowed: sinusoidal, learned, rope, alibi, t5, nope (see --help)"
    ]


def test_help_mentions_the_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["extrapolate", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--schemes", "--train-len", "--eval-lens", "--steps", "--seeds", "--device",
                 "--out", "--plot", "--full"):
        assert flag in out


def test_tiny_run_writes_json_and_plot(tmp_path, capsys):
    out, fig = tmp_path / "results.json", tmp_path / "figure.png"
    argv = ["extrapolate", "--schemes", "alibi,sinusoidal", "--train-len", "8", "--eval-lens",
            "8,24", "--steps", "2", "--seeds", "0", "--device", "cpu", "--eval-tokens", "48",
            "--workers", "1", "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--out", str(out)]
    pytest.importorskip("matplotlib")
    assert main([*argv, "--plot", str(fig)]) == 0
    text = capsys.readouterr().out
    assert "alibi" in text and "sinusoidal" in text and "sha256" in text
    js = json.loads(out.read_text())
    assert set(js) >= {"config", "corpus", "results"}
    assert set(js["corpus"]) >= {"bytes", "sha256"}
    assert set(js["results"]) == {"alibi", "sinusoidal"}
    for scheme in js["results"].values():
        assert set(scheme) == {"8", "24"}
        assert scheme["8"]["tail_loss"] is None and scheme["24"]["tail_loss"] > 0
        assert set(scheme["24"]) == {"loss", "tail_loss"}
    assert js["config"]["train_len"] == 8 and js["config"]["steps"] == 2
    assert fig.stat().st_size > 10_000
    # second run: everything comes from the cache
    assert main(argv) == 0
    assert capsys.readouterr().out.count("loaded from cache") == 2
