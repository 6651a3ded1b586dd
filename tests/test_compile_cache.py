"""``units_lightning.compile_cache``: where the compiler's caches go, and a second process compiling from them."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch._functorch.config
import torch._inductor.config
from tiny_setup import REPO

from units_lightning import compile_cache
from units_lightning.compile_cache import COMPILE_CACHE_VARIABLE, compile_cache_directory, use_compile_cache

TORCH_DEFAULT = compile_cache._torch_default()


@pytest.mark.parametrize(
    "environment, expected",
    [
        ({COMPILE_CACHE_VARIABLE: "/ours", "TORCHINDUCTOR_CACHE_DIR": "/theirs"}, "/ours"),
        ({COMPILE_CACHE_VARIABLE: " ", "TORCHINDUCTOR_CACHE_DIR": "/theirs"}, "/theirs"),
        ({"TORCHINDUCTOR_CACHE_DIR": TORCH_DEFAULT, "UNITS_LIGHTNING_CACHE": "/data-cache"}, "/data-cache/inductor"),
        ({"UNITS_LIGHTNING_CACHE": "/data-cache"}, "/data-cache/inductor"),
        ({}, "~/.cache/units-lightning/inductor"),
    ],
    ids=[
        "our-variable-first",
        "then-a-users-inductor-folder",
        "torchs-tmp-default-is-not-a-choice",
        "data-cache",
        "home",
    ],
)
def test_the_cache_folder_is_chosen_in_the_documented_order(environment, expected):
    assert compile_cache_directory(environment) == compile_cache.Path(expected).expanduser()


def test_the_cache_is_set_up_once_per_process_before_compiling(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(compile_cache, "_in_use", None)
    monkeypatch.setenv(COMPILE_CACHE_VARIABLE, str(tmp_path / "compiled"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", TORCH_DEFAULT)  # as importing torch._dynamo leaves it
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    with caplog.at_level("INFO"):
        assert use_compile_cache() == tmp_path / "compiled"
        monkeypatch.setenv(COMPILE_CACHE_VARIABLE, str(tmp_path / "elsewhere"))
        assert use_compile_cache() == tmp_path / "compiled"  # the folder of the process's first compile
    assert (tmp_path / "compiled").is_dir() and not (tmp_path / "elsewhere").exists()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compiled")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "compiled" / "triton")
    assert torch._inductor.config.fx_graph_cache and torch._functorch.config.enable_autograd_cache
    assert [r.getMessage() for r in caplog.records if "compile cache" in r.getMessage()] == [
        f"compile cache: {tmp_path / 'compiled'} (delete it to recompile from scratch)"
    ]


def test_a_users_own_triton_folder_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_cache, "_in_use", None)
    monkeypatch.setenv(COMPILE_CACHE_VARIABLE, str(tmp_path / "compiled"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", TORCH_DEFAULT)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    use_compile_cache()
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")


COMPILE_ONCE = textwrap.dedent("""
    import json, time
    import torch
    from torch._dynamo.utils import counters
    from units_lightning.compile_cache import use_compile_cache

    folder = use_compile_cache()

    def step(x, w):
        return torch.tanh(x @ w).softmax(-1).sum()

    x, w = torch.randn(8, 4), torch.randn(4, 3, requires_grad=True)
    started = time.perf_counter()
    torch.compile(step)(x, w).backward()
    print(json.dumps({"folder": str(folder), "seconds": time.perf_counter() - started,
                      "inductor": dict(counters["inductor"]), "aot_autograd": dict(counters["aot_autograd"])}))
""")


@pytest.mark.slow  # two cold processes and a C++ build: 140 s on two busy cores
@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="Inductor on the CPU needs a C++ compiler (g++), which this machine lacks",
)
def test_a_second_process_compiles_from_the_first_ones_cache(tmp_path):
    environment = {**os.environ, COMPILE_CACHE_VARIABLE: str(tmp_path / "compiled")}
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
        environment.pop(name, None)
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", COMPILE_ONCE], capture_output=True, text=True, cwd=REPO, env=environment, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["folder"] == second["folder"] == str(tmp_path / "compiled")
    assert first["inductor"].get("fxgraph_cache_miss", 0) > 0 and not first["inductor"].get("fxgraph_cache_hit")
    assert second["inductor"].get("fxgraph_cache_hit", 0) > 0 and not second["inductor"].get("fxgraph_cache_miss")
    assert second["aot_autograd"].get("autograd_cache_hit", 0) > 0
    assert any((tmp_path / "compiled" / "fxgraph").rglob("*")), "no compiled graph written to the folder"
    assert second["seconds"] < first["seconds"] / 2, (first["seconds"], second["seconds"])
