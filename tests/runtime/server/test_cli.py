"""`inferfleet-runtime` entry point and `serve`: readable refusals, and a real serve process answering the client."""

import subprocess
import sys

import openai
import pytest

from inferfleet_runtime.cli import main
from inferfleet_runtime.kernels import native
from inferfleet_runtime.server import cli as serve_cli

from ..support.serve_args import parse_serve
from ..support.server_harness import serve_process


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "inferfleet_runtime.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_unknown_subcommand_exits_2_naming_the_choices(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown subcommand 'frobnicate'" in err and "serve" in err


def test_help_lists_the_subcommands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("serve", "demo-model", "fetch", "compile", "bench"))


def test_serve_refuses_a_directory_without_a_model(tmp_path, capsys):
    assert main(["serve", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no config.json" in err[0]


def test_serve_compiled_without_the_compiled_engine_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "inferfleet_runtime.compiled", None)  # as in a build without it
    # An earlier test may have imported it, and `from package import name` reads the attribute first.
    monkeypatch.delattr(sys.modules["inferfleet_runtime"], "compiled", raising=False)
    (tmp_path / "manifest.json").write_text("{}")
    assert main(["serve", "--engine-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "compiled engine is not available" in err and "--engine paged" in err


def test_serve_refuses_bad_flag_values():
    result = run_cli("serve", "--model", "x", "--kv-cache-memory", "lots")
    assert result.returncode == 2 and "is not a size" in result.stderr
    result = run_cli("serve", "--model", "x", "--block-size", "0")
    assert result.returncode == 2 and "block_size must be positive" in result.stderr


@pytest.mark.slow
def test_serve_process_answers_the_openai_client_under_the_demo_name(demo_model_dir):
    with serve_process("--model", str(demo_model_dir), "--num-kv-blocks", "256") as served:
        client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["inferfleet-demo"]
        reply = client.chat.completions.create(
            model="inferfleet-demo",
            max_tokens=8,
            temperature=0,
            messages=[{"role": "user", "content": "Complete: Beautiful is"}],
        )
        assert reply.choices[0].message.content and reply.usage.completion_tokens <= 8
    assert served.returncode == 0, served.output[-3000:]
    # The default kernels: the C kernels where they build (this machine has a compiler), said at start-up.
    kernels = "native" if native.library() is not None else "reference"
    assert f": float32 on cpu, kernels {kernels}, 256 KV blocks of 16 tokens" in served.output


def test_serve_flags_map_onto_the_engine_config():
    config = serve_cli.config_from_args(
        parse_serve(
            "--model",
            "m",
            "--dtype",
            "bfloat16",
            "--block-size",
            "8",
            "--kv-cache-memory",
            "2GiB",
            "--max-num-seqs",
            "3",
            "--max-num-batched-tokens",
            "77",
            "--max-model-len",
            "99",
            "--max-queue-len",
            "5",
            "--no-prefix-caching",
            "--kernels",
            "triton",
        )
    )
    assert (config.dtype, config.block_size, config.kv_cache_memory, config.num_kv_blocks) == (
        "bfloat16",
        8,
        2**31,
        None,
    )
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.max_context_length, config.max_queue_len) == (
        3,
        77,
        99,
        5,
    )
    assert (config.enable_prefix_caching, config.kernels) == (False, "triton")
    defaults = serve_cli.config_from_args(parse_serve("--model", "m", "--num-kv-blocks", "40"))
    assert (defaults.num_kv_blocks, defaults.block_size, defaults.dtype, defaults.enable_prefix_caching) == (
        40,
        16,
        None,
        True,
    )
    args = parse_serve("--engine-dir", "e")
    assert (args.host, args.port, args.engine) == ("0.0.0.0", 8000, None)


def test_the_context_limit_has_one_name_and_takes_vllms_too():
    assert (
        serve_cli.config_from_args(parse_serve("--model", "m", "--max-context-length", "321")).max_context_length == 321
    )
    assert serve_cli.config_from_args(parse_serve("--model", "m", "--max-model-len", "123")).max_context_length == 123


def test_serve_refuses_an_unsupported_family_in_one_line_left_as_the_termination_message(tmp_path, monkeypatch):
    model = tmp_path / "falcon"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "falcon", "architectures": ["FalconForCausalLM"]}')
    termination = tmp_path / "termination-log"
    termination.write_text("")  # the kubelet creates the file; serve only writes one that exists
    monkeypatch.setenv("INFERFLEET_TERMINATION_LOG", str(termination))
    result = run_cli("serve", "--model", str(model))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert (
        line.startswith("inferfleet-runtime serve: error: cannot serve")
        and "model_type 'falcon' is not supported" in line
    )
    assert "(supported: llama" in line and "qwen3" in line
    assert termination.read_text() == line
