"""Dummy-weight deployments without a tokenizer serve token-id prompts; text and chat get a clear 400."""

from __future__ import annotations

import pytest

from tokenrouter.models.ids_only import IdsOnlyTokenizer
from tokenrouter.runtime.frontend.errors import APIError
from tokenrouter.runtime.frontend.params import completion_prompts
from tokenrouter.runtime.frontend.schemas import CompletionRequest


def test_ids_only_tokenizer():
    tok = IdsOnlyTokenizer(151936)
    assert tok.decode([5, 151935]) == " 5 151935" and tok.eos_token_ids == ()
    with pytest.raises(ValueError, match="token ids"):
        tok.encode("hello")
    with pytest.raises(ValueError, match="chat"):
        tok.encode_chat([{"role": "user", "content": "hi"}])


def test_text_prompt_without_tokenizer_is_a_400_naming_the_prompt():
    tok = IdsOnlyTokenizer(1000)
    assert completion_prompts(CompletionRequest(model="m", prompt=[1, 2, 3]), tok.encode) == [[1, 2, 3]]
    assert completion_prompts(CompletionRequest(model="m", prompt=[[1], [2, 3]]), tok.encode) == [[1], [2, 3]]
    with pytest.raises(APIError) as e:
        completion_prompts(CompletionRequest(model="m", prompt="hello"), tok.encode)
    assert e.value.status == 400 and e.value.param == "prompt"
    with pytest.raises(APIError) as e:  # in a batch, the prompt at fault
        completion_prompts(CompletionRequest(model="m", prompt=["1 2", "hello"]), tok.encode)
    assert e.value.status == 400 and e.value.param == "prompt.0"


def test_serve_falls_back_to_ids_only_for_dummy_weights_and_refuses_for_real_ones(tmp_path):
    from tokenrouter.cli.common import CliError
    from tokenrouter.cli.serve_cmd import entry_tokenizer
    from tokenrouter.core.config import DeploymentConfig, ModelConfig

    tok = entry_tokenizer(DeploymentConfig(models=[ModelConfig("qwen3-0.6b"), ModelConfig("qwen3-32b")]))
    assert isinstance(tok, IdsOnlyTokenizer) and tok.vocab_size == 151936
    assert entry_tokenizer(DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")])).vocab_size
    with pytest.raises(CliError, match="no tokenizer"):
        entry_tokenizer(
            DeploymentConfig(models=[ModelConfig("qwen3-0.6b", path=str(tmp_path)), ModelConfig("qwen3-32b")])
        )
