"""The server command lines are built exactly as documented (pure; no server needed)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from csr_ros import servers
from csr_ros.errors import ConfigError
from csr_ros.router import vllm_pool_server
from csr_ros.servers import (VllmConfig, cpu_dtype, llamacpp_command, llamacpp_server,
                             load_vllm_config, parse_vllm_config, split_cores, vllm_command,
                             vllm_env, vllm_python, vllm_server, vllm_servers)

VLLM_CONFIG = Path(__file__).resolve().parents[1] / "config" / "vllm.yaml"
VLLM_CPU_CONFIG = Path(__file__).resolve().parents[1] / "config" / "vllm_cpu.yaml"


def test_vllm_command_carries_every_flag_csr_relies_on():
    cmd = vllm_command(VllmConfig(model="Qwen/Qwen3-32B", max_model_len=131072, host="0.0.0.0",
                                  served_model_name="policy", python="/v/bin/python"), port=8001)
    # Not the `vllm` console script: vllm-cpu 0.32.0's fails on its own package metadata.
    assert cmd[:5] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                       "--model", "Qwen/Qwen3-32B"]
    assert "--enable-prefix-caching" in cmd
    assert "--enable-prompt-tokens-details" in cmd
    assert _flags(cmd).items() >= {"--scheduling-policy": "priority", "--max-model-len": "131072",
                                   "--port": "8001", "--host": "0.0.0.0",
                                   "--served-model-name": "policy"}.items()


def test_vllm_command_can_leave_out_priority_scheduling_and_appends_extra_args():
    cmd = vllm_command(VllmConfig(model="m", max_model_len=4096, priority_scheduling=False,
                                  extra_args=["--tensor-parallel-size", "2"]), port=1)
    assert "--scheduling-policy" not in cmd
    assert cmd[-2:] == ["--tensor-parallel-size", "2"]


def test_a_vllm_recipe_rejects_a_nonpositive_max_model_len_and_two_kv_cache_sizes():
    with pytest.raises(ConfigError, match="max_model_len"):
        VllmConfig(model="m", max_model_len=0)
    with pytest.raises(ConfigError, match="kv_cache_gib or kv_cache_bytes, not both"):
        VllmConfig(model="m", max_model_len=8, kv_cache_gib=1, kv_cache_bytes=2**29)


def test_vllm_command_runs_the_vllm_environment_by_default_with_dtype_and_block_size():
    cmd = vllm_command(VllmConfig(model="m", max_model_len=4096, dtype="float32", block_size=32),
                       port=1)
    assert cmd[0] == vllm_python()
    assert _flags(cmd).items() >= {"--dtype": "float32", "--block-size": "32"}.items()


def test_vllm_python_prefers_the_variable_then_the_vllm_venv(monkeypatch):
    monkeypatch.setenv("CSR_ROS_VLLM_PYTHON", "/somewhere/python")
    assert vllm_python() == "/somewhere/python"
    monkeypatch.delenv("CSR_ROS_VLLM_PYTHON")
    venv = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    assert vllm_python() == (str(venv) if venv.is_file() else sys.executable)


def test_a_cpu_vllm_env_binds_its_cores_and_sizes_its_kv_cache():
    cpu = VllmConfig(model="m", max_model_len=8, device="cpu", kv_cache_gib=2)
    env = vllm_env(cpu, cpus="2-3", base={"CUDA_VISIBLE_DEVICES": "0"})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2-3"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(ConfigError, match="whole number of GiB"):
        replace(cpu, kv_cache_gib=1.5)


def test_cores_are_split_evenly_and_disjointly_between_cpu_servers():
    assert split_cores(2, 2) == ["0", "1"]
    assert split_cores(8, 2) == ["0-3", "4-7"]
    assert split_cores(5, 2) == ["0-1", "2-3"]
    with pytest.raises(ConfigError, match="at least 2 cores"):
        split_cores(1, 2)


def test_the_cpu_dtype_is_bfloat16_only_where_the_cpu_computes_it_natively():
    assert cpu_dtype({"avx2", "fma"}) == "float32"
    assert cpu_dtype({"avx512f", "avx512_bf16"}) == "bfloat16"
    assert cpu_dtype({"amx_bf16"}) == "bfloat16"
    assert cpu_dtype() in ("float32", "bfloat16")


def test_csr_ros_cpu_bf16_makes_the_machine_take_the_other_precision_path(monkeypatch):
    monkeypatch.setenv("CSR_ROS_CPU_BF16", "0")
    assert cpu_dtype() == "float32"
    monkeypatch.setenv("CSR_ROS_CPU_BF16", "1")
    assert cpu_dtype() == "bfloat16"
    assert cpu_dtype({"avx2"}) == "float32"        # flags given: read as they are
    monkeypatch.setenv("CSR_ROS_CPU_BF16", "yes")
    with pytest.raises(ConfigError, match="CSR_ROS_CPU_BF16 must be 0 or 1"):
        cpu_dtype()


def test_the_shipped_cpu_config_starts_r1_and_r2_on_their_own_cores_with_the_cpu_flags():
    import yaml

    raw = yaml.safe_load(VLLM_CPU_CONFIG.read_text())
    raw["model"] = "/models/smollm2"          # a directory as it is (no conversion here)
    config = parse_vllm_config(raw)
    assert config.device == "cpu" and config.dtype in ("float32", "bfloat16")
    r1, r2 = vllm_servers(config, env_base={}, n_cores=2)
    assert (r1.env["VLLM_CPU_OMP_THREADS_BIND"], r2.env["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")
    for server in (r1, r2):
        cmd = server.command
        assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model",
                            "/models/smollm2"]
        assert server.env["VLLM_CPU_KVCACHE_SPACE"] == str(raw["kv_cache_gib"])
        for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details"):
            assert flag in cmd
        assert _flags(cmd).items() >= {"--scheduling-policy": "priority", "--dtype": config.dtype,
                                       "--block-size": "32", "--max-num-seqs": "4"}.items()
        assert "--enforce-eager" in cmd and "--disable-log-stats" in cmd
    assert [r1.url, r2.url] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]


def test_a_cpu_config_takes_cores_per_server_and_refuses_an_unknown_device():
    config = parse_vllm_config({"model": "m", "max_model_len": 8, "device": "cpu",
                                "servers": [{"port": 1, "cpus": "0-1"}, {"port": 2, "cpus": "2"}]})
    assert [s.cpus for s in config.servers] == ["0-1", "2"]
    with pytest.raises(ConfigError, match="device must be one of"):
        parse_vllm_config({"model": "m", "max_model_len": 8, "device": "tpu",
                           "servers": [{"port": 1}]})


def test_vllm_env_pins_one_gpu_and_passes_the_api_key_by_variable_not_argv():
    keyed = VllmConfig(model="m", max_model_len=8, api_key_env="MY_KEY")
    env = vllm_env(keyed, gpu=1, base={"MY_KEY": "s3cret", "PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["VLLM_API_KEY"] == "s3cret"
    assert env["PATH"] == "/bin"


def test_vllm_env_refuses_an_empty_api_key_variable():
    with pytest.raises(ConfigError, match="MY_KEY"):
        vllm_env(VllmConfig(model="m", max_model_len=8, api_key_env="MY_KEY"), gpu=0, base={})


def test_llamacpp_command_runs_the_wrapper_with_context_threads_and_alias():
    cmd = llamacpp_command("/m/model.gguf", port=8001, n_ctx=8192, n_threads=2, model_alias="smollm2")
    assert cmd[:4] == [sys.executable, "-m", "csr_ros.servers", "llamacpp"]
    assert _flags(cmd).items() >= {"--model": "/m/model.gguf", "--n-ctx": "8192",
                                   "--n-threads": "2", "--host": "127.0.0.1",
                                   "--model-alias": "smollm2"}.items()


def test_the_shipped_vllm_config_starts_r1_on_gpu0_and_r2_on_gpu1():
    config = load_vllm_config(VLLM_CONFIG)
    r1, r2 = vllm_servers(config, env_base={})
    assert (r1.name, r1.env["CUDA_VISIBLE_DEVICES"]) == ("r1", "0")
    assert (r2.name, r2.env["CUDA_VISIBLE_DEVICES"]) == ("r2", "1")
    for server in (r1, r2):
        assert "--enable-prefix-caching" in server.command
        assert "--enable-prompt-tokens-details" in server.command
        assert server.command[server.command.index("--max-model-len") + 1] == str(config.max_model_len)
        assert server.url.startswith("http://127.0.0.1:")   # 0.0.0.0 binds; clients use loopback
    assert r1.url != r2.url


def test_vllm_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match="'model' is required"):
        parse_vllm_config({"max_model_len": 1, "servers": [{"port": 1, "gpu": 0}]})
    with pytest.raises(ConfigError, match="unknown keys"):
        parse_vllm_config({"model": "m", "max_model_len": 1, "servers": [], "mdoel": "x"})
    with pytest.raises(ConfigError, match=r"servers\[0\] needs"):
        parse_vllm_config({"model": "m", "max_model_len": 1, "servers": [{"port": 1}]})
    with pytest.raises(ConfigError, match="share a port"):
        parse_vllm_config({"model": "m", "max_model_len": 1,
                           "servers": [{"port": 1, "gpu": 0}, {"port": 1, "gpu": 1}]})


def test_serve_dry_run_prints_both_vllm_commands(capsys):
    from csr_ros.cli import main

    assert main(["serve", "vllm", "--config", str(VLLM_CONFIG), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("r1: CUDA_VISIBLE_DEVICES=0 ")
    assert out[1].startswith("r2: CUDA_VISIBLE_DEVICES=1 ")
    assert all("-m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-32B" in line
               for line in out)


def _flags(command: list[str]) -> dict[str, str | None]:
    """A command line's options: flag -> value (None for a switch)."""
    return {flag: (value if not value.startswith("--") else None)
            for flag, value in zip(command, command[1:] + ["--"]) if flag.startswith("--")}


def _options(command: list[str]) -> dict[str, str | None]:
    """A vLLM command line's options after the model and the port: flag -> value (None for a
    switch)."""
    return _flags(command[command.index("--port") + 2:])


def test_serve_the_router_pool_and_the_test_servers_build_their_vllm_flags_from_one_yaml(
        tmp_path, monkeypatch):
    """`csr-ros serve`, the router's pool and the test servers run config/vllm_cpu.yaml's
    flags; each differs from it only where it says why, and editing the file changes all."""
    import yaml
    from support.vllm_server import make_vllm_server

    def built(config_path: Path) -> tuple:
        monkeypatch.setattr(servers, "VLLM_CPU_CONFIG", config_path)
        serve = vllm_servers(replace(load_vllm_config(config_path), model="/models/smollm2"),
                             env_base={}, n_cores=2)[0]
        pool = vllm_pool_server("/models/smollm2", port=8001, cpus="0", kv_cache_gib=1,
                                base_env={})
        test = make_vllm_server("vllm-r1", "/models/smollm2", "0", tmp_path / "r1.log")
        return serve, pool, test

    serve, pool, test = built(VLLM_CPU_CONFIG)
    for server in (serve, pool, test):
        assert server.command[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model",
                                       "/models/smollm2"]
        assert server.env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    flags = _options(serve.command)
    assert {"--enforce-eager", "--max-num-seqs", "--block-size", "--disable-log-stats",
            "--enable-prefix-caching", "--scheduling-policy"} <= set(flags)
    # the test servers: float32 (log probabilities against a float32 reference), 1 GiB of cache
    assert _options(test.command) == flags | {"--dtype": "float32"}
    assert (serve.env["VLLM_CPU_KVCACHE_SPACE"], test.env["VLLM_CPU_KVCACHE_SPACE"]) == ("2", "1")
    assert (serve.health_timeout_s, test.health_timeout_s) == (1800, 900)
    # the pool: its KV cache in bytes, more sequences for K robots, stats on for /metrics
    del flags["--disable-log-stats"]
    assert _options(pool.command) == flags | {"--max-num-seqs": "8",
                                              "--kv-cache-memory-bytes": str(2**30)}
    assert "VLLM_CPU_KVCACHE_SPACE" not in pool.env

    raw = yaml.safe_load(VLLM_CPU_CONFIG.read_text())
    raw |= {"block_size": 64, "max_num_seqs": 6, "extra_args": ["--seed", "7"]}
    edited = tmp_path / "vllm_cpu.yaml"
    edited.write_text(yaml.safe_dump(raw))
    rebuilt = built(edited)
    for server in rebuilt:
        options = _options(server.command)
        assert options["--block-size"] == "64" and options["--seed"] == "7"
        assert server.command[-2:] == ["--seed", "7"]
    assert [_options(s.command)["--max-num-seqs"] for s in rebuilt] == ["6", "8", "6"]


def test_a_vllm_override_is_checked_as_the_file_is():
    recipe = VllmConfig(model="m", max_model_len=8, device="cpu")
    with pytest.raises(ConfigError, match=r"not vLLM settings: \['max_num_seq'\]"):
        vllm_server(recipe, port=1, max_num_seq=8)
    with pytest.raises(ConfigError, match="max_num_seqs must be a whole number"):
        vllm_server(recipe, port=1, max_num_seqs=0)
    server = vllm_server(recipe, port=8001, cpus="1", max_model_len=4096, env_base={})
    assert server.command[server.command.index("--max-model-len") + 1] == "4096"
    assert server.url == "http://127.0.0.1:8001" and server.name == "vllm:8001"


def test_a_llamacpp_server_takes_its_key_by_environment_and_is_reached_on_loopback():
    server = llamacpp_server("/m/model.gguf", port=8001, host="0.0.0.0", api_key="k")
    assert server.env["CSR_ROS_SERVER_API_KEY"] == "k" and "k" not in server.command
    assert server.url == "http://127.0.0.1:8001" and server.name == "llama.cpp:8001"
    assert server.command == llamacpp_command("/m/model.gguf", port=8001, host="0.0.0.0")
    assert llamacpp_server("/m/model.gguf", port=8001).env is None
