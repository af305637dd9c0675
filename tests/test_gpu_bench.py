import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"


def test_gpu_benchmark_runs_unchanged_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: run benchmarks/gpu.py itself")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("no GPU: ")


def test_peak_table_reads_device_names():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert gpu.peak_gbs("NVIDIA H200") == 4800.0
    assert gpu.peak_gbs("NVIDIA H100 80GB HBM3") == 3350.0
    assert gpu.peak_gbs("NVIDIA A100-SXM4-40GB") == 1560.0
    assert gpu.peak_gbs("NVIDIA A100 80GB PCIe") == 2000.0
    assert gpu.peak_gbs("Tesla T4") == 320.0
    assert gpu.peak_gbs("NVIDIA GeForce RTX 4090") == 1000.0
    assert gpu.peak_gbs("NVIDIA L4") == 300.0
    assert gpu.peak_gbs("NVIDIA L40S") != 300.0
    assert gpu.peak_gbs("Some Future GPU") is None
