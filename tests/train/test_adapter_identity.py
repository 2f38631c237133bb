"""A saved adapter's hash does not depend on where the base model lies: the trained policy's id
(and so its evaluation's sampling seeds) is the same on every machine for the same weights."""

import shutil

import torch


def test_a_saved_adapter_hashes_the_same_wherever_the_base_model_lies(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tasks.hashing import sha256_dir
    from tasks.train.trainer import normalize_adapter_config

    shas = []
    for where in ("a", "elsewhere/b"):
        model_dir = tmp_path / where / "tiny-model"
        shutil.copytree(tiny_model_dir, model_dir)
        torch.manual_seed(0)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                               LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        out = tmp_path / where / "adapter"
        model.save_pretrained(out, selected_adapters=["default"])
        assert str(model_dir) in (out / "README.md").read_text()  # peft's model card names the local path
        normalize_adapter_config(out, base_model_id="tiny-model@0123456789ab")
        assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        assert str(model_dir) not in (out / "adapter_config.json").read_text()
        shas.append(sha256_dir(out))
    assert shas[0] == shas[1]
