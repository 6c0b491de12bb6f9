"""Precompiled functions: compiled once, saved, and loaded (not traced) by a later process."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from emonet.engine import precompile

pytestmark = [pytest.mark.skipif(not precompile.available(), reason="this torch has no precompile API"),
              pytest.mark.slow]  # end-to-end: processes of their own

ROOT = Path(__file__).resolve().parent.parent


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(torch.relu(self.bn(x)))


def run_block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(x)


def mark_batch(args: tuple) -> None:
    if args[1].shape[0] > 1:
        torch._dynamo.mark_dynamic(args[1], 0)


def blocks(n: int) -> list[Block]:
    torch.manual_seed(0)
    return [Block().eval() for _ in range(n)]


def test_a_second_process_loads_the_compiled_function_instead_of_compiling(tmp_path):
    a, b = blocks(2)
    with torch.inference_mode():
        x = torch.randn(1, 4, 8, 8)
        first = precompile.Precompiled(run_block, tmp_path / "block")
        assert torch.allclose(first(a, x), a(x), atol=1e-5)
        assert torch.allclose(first(b, x), b(x), atol=1e-5)  # the weights are inputs: one compilation
    assert (first.compiled, first.loaded) == (1, 0)
    assert len(list((tmp_path / "block").glob("*.bin"))) == 1

    # A fresh process: same function, same folder; it must load, not compile.
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from emonet.engine import precompile
        from tests.test_precompile import blocks, run_block  # the module name pytest gives it: guards check types
        a, _ = blocks(2)
        with torch.inference_mode():
            x = torch.randn(1, 4, 8, 8)
            p = precompile.Precompiled(run_block, sys.argv[1])
            ok = torch.allclose(p(a, x), a(x), atol=1e-5)
        print(p.loaded, p.compiled, ok)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "block")], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "0", "True"]


def test_a_new_shape_compiles_once_more_and_a_dynamic_mark_serves_every_batch(tmp_path):
    (a,) = blocks(1)
    p = precompile.Precompiled(run_block, tmp_path / "block", mark=mark_batch)
    with torch.inference_mode():
        for n in (1, 2, 3, 5):
            x = torch.randn(n, 4, 8, 8)
            assert torch.allclose(p(a, x), a(x), atol=1e-5)
    assert p.compiled == 2  # batch 1, and one graph for every batch > 1


def test_an_unreadable_artifact_is_reported_replaced_and_recompiled(tmp_path, capsys):
    folder = tmp_path / "block"
    folder.mkdir()
    (folder / "broken.bin").write_bytes(b"not a pickle")
    (a,) = blocks(1)
    lines = []
    p = precompile.Precompiled(run_block, folder, log=lines.append)
    with torch.inference_mode():
        x = torch.randn(1, 4, 8, 8)
        assert torch.allclose(p(a, x), a(x), atol=1e-5)
    assert len(lines) == 1 and "broken.bin could not be loaded" in lines[0]
    assert (p.loaded, p.compiled) == (0, 1)
    assert not (folder / "broken.bin").exists() and len(list(folder.glob("*.bin"))) == 1


def test_a_folder_that_cannot_be_written_costs_the_saving_not_the_compiled_function(tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("not a folder")
    (a,) = blocks(1)
    lines = []
    p = precompile.Precompiled(run_block, taken / "block", log=lines.append)
    with torch.inference_mode():
        x = torch.randn(1, 4, 8, 8)
        assert torch.allclose(p(a, x), a(x), atol=1e-5)
        assert torch.allclose(p(a, x), a(x), atol=1e-5)  # kept in this process: compiled once
    assert p.compiled == 1
    assert len(lines) == 1 and "could not be saved" in lines[0] and "the next start compiles again" in lines[0]


def test_without_a_folder_it_is_plain_torch_compile():
    wrap = precompile.compiler(None)
    (a,) = blocks(1)
    fn = wrap(run_block, "block", mark_batch)
    assert not isinstance(fn, precompile.Precompiled)
    with torch.inference_mode():
        x = torch.randn(2, 4, 8, 8)
        assert torch.allclose(fn(a, x), a(x), atol=1e-5)


def test_the_digest_changes_with_what_the_code_depends_on():
    assert precompile.code_digest("H100", "fp16") == precompile.code_digest("H100", "fp16")
    assert precompile.code_digest("H100", "fp16") != precompile.code_digest("H100", "bf16")
