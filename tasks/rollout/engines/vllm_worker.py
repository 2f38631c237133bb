"""The vLLM worker: runs ``vllm.LLM`` in the ``.venv-vllm`` interpreter and answers requests from
:class:`tasks.rollout.engines.vllm_engine.VLLMPolicy` over a JSON-lines pipe.

Standard library + vLLM only (and :mod:`lora_delta` beside it, torch only): it runs in a venv that
does not have (and must not import) the harnessrl packages, and it is started by file path, so
nothing beside it may be named like a package it imports.

Protocol (one JSON object per line; stdin -> requests, the private reply pipe -> replies):

* start: ``argv[1]`` is a JSON object ``{"model": DIR, "dtype": "bfloat16"|"float32",
  "max_model_len": int, "max_lora_rank": int | null, "seed": int, "prefix_caching": bool, "device": "cpu"|"cuda",
  "gpu_memory_utilization": float}``; the worker replies ``{"ok": true, "ready": true,
  "vllm_version": str, "eos_token_id": int}`` once the engine is loaded.
* ``{"op": "generate", "prompts": [[int]], "seeds": [int], "temperature": float, "top_p": float,
  "top_k": int, "max_tokens": int, "stop_token_ids": [int], "adapter": DIR | null,
  "progress_every_s": float}`` ->
  ``{"ok": true, "outputs": [{"token_ids": [int], "logprobs": [float], "finish_reason": str}]}``,
  preceded by zero or more ``{"ok": true, "progress": int}`` lines while the batch runs (the number
  of its requests finished so far, increasing, at most one per ``progress_every_s``);
  ``logprobs[t]`` is the log-prob (nats) of ``token_ids[t]`` under the PROCESSED sampling
  distribution (``logprobs_mode="processed_logprobs"``: vLLM's sampler returns
  ``log_softmax`` of the float32 logits after temperature, top-k and top-p; see
  ``vllm/v1/sample/ops/topk_topp_sampler.py``).
* ``{"op": "load_weights", "path": FILE}`` -> ``{"ok": true, "seconds": float, "names": int}``: the
  safetensors file's tensors (checkpoint names, e.g. ``model.layers.0.self_attn.q_proj.weight``)
  are loaded into the running engine in place by vLLM's own ``reload_weights`` (which restores
  the layers from their kernel format, loads, and re-runs the kernels' weight processing, e.g. the
  CPU oneDNN prepacking); the prefix cache is reset. Layers absent from the file keep their weights.
* ``{"op": "load_adapter", "path": FILE, "scale": float}`` -> ``{"ok": true, "seconds": float,
  "names": int, "modules": int, "layers": int, "params": int}``: the safetensors file's LoRA factors
  (peft names, ``...q_proj.lora_A.weight``) become the served adapter, applied unmerged in float32
  beside the base weights by forward hooks (:mod:`lora_delta`, beside this file); the first load
  installs the hooks, later loads copy the factors in place and must name the same modules. The
  prefix cache is reset. Generate requests then name no adapter.
* ``{"op": "score", "prompts": [[int]]}`` -> ``{"ok": true, "logprobs": [[float]]}``: the log-prob
  of each prompt token after the first under the current weights (temperature 1, no top-k/p).
* ``{"op": "shutdown"}`` -> ``{"ok": true}`` and the worker exits.

Any failure is answered ``{"ok": false, "error": traceback}``. vLLM's own logging is sent to
stderr: the reply pipe is a duplicate of the original stdout taken before vLLM is imported, and
file descriptor 1 is pointed at stderr, so nothing vLLM prints can corrupt a reply.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _serve(reply, config: dict) -> None:
    from vllm import LLM
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    import vllm

    llm = LLM(**engine_kwargs(config))
    eos = llm.get_tokenizer().eos_token_id
    _send(reply, {"ok": True, "ready": True, "vllm_version": vllm.__version__, "eos_token_id": eos})

    adapters: dict[str, int] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "shutdown":
                _send(reply, {"ok": True})
                return
            if op == "load_weights":
                _send(reply, _load_weights(llm, req["path"]))
                continue
            if op == "load_adapter":
                _send(reply, _load_adapter(llm, req["path"], float(req["scale"])))
                continue
            if op == "score":
                _send(reply, {"ok": True, "logprobs": _score(llm, req["prompts"])})
                continue
            if op != "generate":
                raise ValueError(f"unknown op {op!r}")
            lora = None
            if req.get("adapter"):
                path = req["adapter"]
                adapters.setdefault(path, len(adapters) + 1)
                lora = LoRARequest(f"adapter-{adapters[path]}", adapters[path], path)
            params = sampling_params(req)
            prompts = [TokensPrompt(prompt_token_ids=p) for p in req["prompts"]]
            results = generate_in_steps(llm, prompts, params, lora, lambda done: _send(reply, {"ok": True, "progress": done}),
                                float(req.get("progress_every_s", 0.25)))
            outputs = []
            for r in results:
                c = r.outputs[0]
                toks = list(c.token_ids)
                lps = [float(step[t].logprob) for t, step in zip(toks, c.logprobs or [])]
                if len(lps) != len(toks):
                    raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(toks)} tokens")
                outputs.append({"token_ids": toks, "logprobs": lps, "finish_reason": c.finish_reason})
            _send(reply, {"ok": True, "outputs": outputs})
        except Exception:  # answered, not raised: the engine turns it into an exception
            _send(reply, {"ok": False, "error": traceback.format_exc()})


def engine_kwargs(config: dict) -> dict:
    """``vllm.LLM``'s arguments for the start config (see the module docstring)."""
    kwargs = dict(
        model=config["model"], tokenizer=config["model"], dtype=config["dtype"],
        max_model_len=config["max_model_len"], enforce_eager=True, seed=config["seed"],
        # sampled-token log-probs under the distribution actually sampled from
        logprobs_mode="processed_logprobs",
        # ignore the model's generation_config.json: its extra EOS ids and default sampling
        # settings would make vLLM stop or sample differently from the transformers engine
        generation_config="vllm",
        max_logprobs=1,
        # no chunked prefill: vLLM rewinds the generator of a seeded request whose prefill was cut
        # into chunks with a CUDA-only call (CPU generators raise "does not use offset"), and every
        # request here is seeded. Whole prompts only, so the step budget must hold the longest.
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(int(config["max_model_len"]), 8192),
        enable_prefix_caching=bool(config.get("prefix_caching", False)),
    )
    if config.get("max_lora_rank"):
        kwargs.update(enable_lora=True, max_lora_rank=config["max_lora_rank"], max_loras=1)
    if config.get("device") == "cuda":
        kwargs["gpu_memory_utilization"] = config.get("gpu_memory_utilization", 0.5)
    return kwargs


def sampling_params(req: dict) -> list:
    """One ``SamplingParams`` per seed of a ``generate`` request."""
    from vllm import SamplingParams

    return [
        SamplingParams(
            n=1, temperature=req["temperature"], top_p=req["top_p"], top_k=req["top_k"],
            max_tokens=req["max_tokens"], seed=s, logprobs=0, detokenize=False,
            stop_token_ids=req["stop_token_ids"], repetition_penalty=1.0, min_p=0.0,
        )
        for s in req["seeds"]
    ]


def generate_in_steps(llm, prompts: list, params: list, lora, on_progress, every_s: float = 0.25) -> list:
    """``llm.generate(prompts, params, lora_request=lora)``'s outputs (in prompt order), by the same
    engine step loop (``LLM._run_engine``: enqueue every request, step until none is unfinished),
    calling ``on_progress(done)`` with the number of finished requests as they finish: at most every
    ``every_s`` seconds, and not for the last (the outputs follow at once)."""
    import time

    ids = llm.enqueue(prompts, params, lora_request=lora, use_tqdm=False)
    results: list = []
    sent, last = 0, time.monotonic()
    engine = llm.llm_engine
    try:
        while engine.has_unfinished_requests():
            results.extend(out for out in engine.step() if out.finished)
            now = time.monotonic()
            if sent < len(results) < len(ids) and now - last >= every_s:
                on_progress(len(results))
                sent, last = len(results), now
    except BaseException:
        engine.abort_request(ids, internal=True)  # the next call must not step this batch's leftovers
        raise
    if len(results) != len(ids):
        raise RuntimeError(f"vLLM finished {len(results)} of {len(ids)} requests")
    # as LLM._run_engine: outputs carry the request counter as their (external) id
    return sorted(results, key=lambda r: int(r.request_id))


def _load_weights(llm, path: str) -> dict:
    import time

    from safetensors.torch import load_file

    t0 = time.perf_counter()
    state = load_file(path)
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items()), "is_checkpoint_format": True})
    llm.reset_prefix_cache()
    return {"ok": True, "seconds": time.perf_counter() - t0, "names": len(state)}


def _load_adapter(llm, path: str, scale: float) -> dict:
    import time

    from lora_delta import LoraDelta  # beside this file (the worker is started by path)
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    tensors = load_file(path)

    def apply(model):
        delta = getattr(model, "_harnessrl_lora_delta", None)
        if delta is None:
            delta = LoraDelta(model, getattr(model, "packed_modules_mapping", {}), next(model.parameters()).device)
            model._harnessrl_lora_delta = delta
        return delta.load(tensors, scale)

    info = llm.apply_model(apply)[0]
    llm.reset_prefix_cache()
    return {"ok": True, "seconds": time.perf_counter() - t0, "names": len(tensors), **info}


def _score(llm, prompts: list) -> list:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=1.0, top_p=1.0, top_k=0, prompt_logprobs=0, detokenize=False)
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    out = []
    for p, r in zip(prompts, results):
        lps = r.prompt_logprobs or []
        out.append([float(step[t].logprob) for t, step in zip(p[1:], lps[1:])])
    return out


def _send(reply, obj: dict) -> None:
    reply.write(json.dumps(obj) + "\n")
    reply.flush()


def exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """Start a daemon thread that ends the worker when the process that started it is gone.

    The engine starts the worker in a session of its own (so that it can end the worker's whole
    group), which a kill of the parent's group does not reach; and a worker in the middle of a
    batch reads no stdin, so it would not see the closed pipe until the batch ends (minutes, on
    the CPU). Every ``every_s`` seconds the thread compares ``os.getppid()`` with ``parent``; when
    they differ (the parent died, the worker was re-parented) it SIGKILLs the worker's process
    group if the worker leads it (vLLM's own processes with it), else the worker alone.
    """
    import signal
    import threading
    import time

    def watch() -> None:
        while True:
            time.sleep(every_s)
            if os.getppid() != parent:
                if os.getpgid(0) == os.getpid():
                    os.killpg(os.getpid(), signal.SIGKILL)
                os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main() -> None:
    exit_with_parent(os.getppid())
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        config = json.loads(sys.argv[1])
        _serve(reply, config)
    except Exception:
        _send(reply, {"ok": False, "error": traceback.format_exc()})
        raise SystemExit(1)


if __name__ == "__main__":
    main()
