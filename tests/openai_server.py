"""A small real OpenAI-compatible completions server of a local model, for the tests of the
``openai`` engine's several servers (``policy.openai.base_urls``): starting two ``vllm serve``
processes would take minutes of the test budget on 2 cores.

``python -m tests.openai_server --model DIR --port N`` serves ``POST /v1/completions`` the way
``vllm serve --logprobs-mode processed_logprobs`` answers the requests the engine sends: the
prompt as token ids, one completion per request sampled by harnessrl's ``hf`` engine
(:class:`tasks.rollout.engines.hf.HFPolicy`, seeded with the request's ``seed``, so the answer is a
function of the weights, the prompt, the sampling and the seed: any two servers of one model give
the same completion), the completion's ``token_ids``, and log-probs of the processed distribution
with tokens named ``token_id:N``. ``GET /v1/models`` lists the model; ``GET /stats`` says how many
completions this server has served.
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any


def make_app(model_dir: Path, served_name: str) -> Any:
    from fastapi import FastAPI, HTTPException

    from tasks.config import PolicyConfig
    from tasks.harnesses.spec import SamplingSpec
    from tasks.rollout.engines.hf import HFPolicy

    policy = HFPolicy(model_dir, PolicyConfig(model=str(model_dir), rollout_dtype="float32", torch_threads=1),
                      base_model_id=served_name)
    lock = threading.Lock()
    served = [0]
    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served_name, "object": "model", "owned_by": "harnessrl-tests"}]}

    @app.get("/stats")
    def stats() -> dict[str, int]:
        return {"completions": served[0]}

    @app.post("/v1/completions")
    def completions(body: dict[str, Any]) -> dict[str, Any]:
        if body.get("model") != served_name:
            raise HTTPException(404, f"model {body.get('model')!r} is not served here")
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            raise HTTPException(400, "prompt must be a list of token ids")
        if body.get("stop_token_ids") not in (None, [policy.eos_id]):
            raise HTTPException(400, "only the tokenizer's EOS stops a completion here")
        sampling = SamplingSpec(temperature=float(body.get("temperature", 1.0)), top_k=int(body.get("top_k", 0)),
                                top_p=float(body.get("top_p", 1.0)), max_new_tokens=int(body["max_tokens"]))
        with lock:
            g = policy.generate([prompt], sampling, int(body.get("seed", 0)))[0]
            served[0] += 1
        return {"id": f"cmpl-{served[0]}", "object": "text_completion", "created": 0, "model": served_name,
                "choices": [{"index": 0, "text": g.text, "finish_reason": g.finish_reason, "token_ids": g.token_ids,
                             "logprobs": {"tokens": [f"token_id:{t}" for t in g.token_ids],
                                          "token_logprobs": g.logprobs, "text_offset": [0] * len(g.token_ids),
                                          "top_logprobs": None}}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(g.token_ids),
                          "total_tokens": len(prompt) + len(g.token_ids)}}

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--served-model-name", default="tiny")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvicorn.run(make_app(args.model, args.served_model_name), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
