"""Engine kinds are declared once (``engines.kinds``): the CLI's choices, the adapters and
capture mode read the same rows, so ``--mode passthrough`` on an engine without a capture mode
is refused by name before anything starts (it used to start and talk vLLM's capture fields to
llama-server)."""

from __future__ import annotations

import pytest

from turnstile.app import cli
from turnstile.engines import ENGINE_KINDS, KINDS, capture_kind, engine_kind, make_engine
from turnstile.engines.capture import capture_engine

pytestmark = pytest.mark.unit


def test_every_alias_names_its_kind_and_unknown_names_are_refused():
    for kind in ENGINE_KINDS:
        for name in (kind.name, *kind.aliases, kind.name.upper()):
            assert engine_kind(name) is kind
    with pytest.raises(ValueError, match="choose one of llama-cpp, vllm, sglang"):
        engine_kind("tgi")


def test_an_adapter_is_refused_an_option_its_kind_does_not_take():
    with pytest.raises(ValueError, match="llama-cpp engine takes no option api"):
        make_engine("llama-cpp", "http://127.0.0.1:1", api="generate")
    assert make_engine("vllm", "http://127.0.0.1:1", api="completions").name == "vllm"


def test_each_capture_kind_has_a_capture_engine():
    for kind in ENGINE_KINDS:
        if kind.capture is not None:
            assert capture_engine("http://127.0.0.1:1", kind.capture).url


def test_passthrough_on_llama_cpp_is_refused_by_name_before_it_starts(tmp_path, capsys):
    with pytest.raises(ValueError, match="llama-cpp cannot"):
        capture_kind("llama-cpp")
    with pytest.raises(SystemExit) as exc:
        cli.main(
            [
                "serve",
                "--mode",
                "passthrough",
                "--engine",
                "llama-cpp",
                "--engine-url",
                "http://127.0.0.1:9",
                "--model",
                "m",
                "--data",
                str(tmp_path),
                "--no-auth",
            ]
        )
    message = str(exc.value)
    assert message.startswith("turnstile: refusing to start: --mode passthrough needs")
    assert "(vllm, sglang)" in message and "llama-cpp cannot" in message
    assert not any(tmp_path.iterdir())  # nothing was started or written


def test_the_cli_takes_exactly_the_declared_kinds(capsys):
    for name in KINDS:
        args = cli.build_parser().parse_args(
            ["serve", "--engine", name, "--engine-url", "u", "--model", "m"]
        )
        assert args.engine == name
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(
            ["serve", "--engine", "tgi", "--engine-url", "u", "--model", "m"]
        )
    assert "invalid choice: 'tgi'" in capsys.readouterr().err
