"""``tasks.rollout.kv_cache``: a reserved key/value cache holds what transformers' growing one holds,
and ``generate`` samples the same tokens and log-probs with it."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from tasks.rollout.kv_cache import ReservedLayer, reserved_cache


def _steps(seed=0):
    g = torch.Generator().manual_seed(seed)
    # a prefill of 5 positions, then single-position decode steps: [B=3, heads=2, k, head_dim=4]
    return [(torch.randn(3, 2, k, 4, generator=g), torch.randn(3, 2, k, 4, generator=g)) for k in (5, 1, 1, 2, 1)]


@pytest.mark.parametrize("capacity", [10, 6, 1])  # room for all, a growth in the middle, growth every time
def test_updates_return_what_concatenation_returns(capacity):
    ours, ref = ReservedLayer(capacity), DynamicLayer()
    for k, v in _steps():
        got, want = ours.update(k, v), ref.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert ours.get_seq_length() == ref.get_seq_length()
    assert ours.get_mask_sizes(1) == ref.get_mask_sizes(1)


def test_row_selection_crop_and_reset_follow_the_filled_part():
    ours, ref = ReservedLayer(16), DynamicLayer()
    steps = _steps(1)
    for k, v in steps[:2]:
        ours.update(k, v), ref.update(k, v)
    rows = torch.tensor([2, 0, 0, 1])  # a shared prompt gathered to several rows
    ours.batch_select_indices(rows), ref.batch_select_indices(rows)
    assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
    k, v = (t[rows] for t in steps[2])
    assert torch.equal(ours.update(k, v)[0], ref.update(k, v)[0])  # later steps land after the selection
    ours.crop(-2), ref.crop(-2)
    assert ours.get_seq_length() == ref.get_seq_length() == 5 and torch.equal(ours.keys, ref.keys)
    ours.batch_repeat_interleave(2), ref.batch_repeat_interleave(2)
    assert torch.equal(ours.values, ref.values)
    with pytest.raises(ValueError, match="tokens_to_remove"):
        ours.crop(1)
    ours.reset()
    assert ours.get_seq_length() == 0
    assert ours.update(*steps[0])[0].shape == (3, 2, 5, 4)
    with pytest.raises(ValueError, match="capacity"):
        ReservedLayer(0)


@pytest.mark.parametrize("room", [12, 3])  # every new token reserved; or grown twice during generate
def test_generate_samples_the_same_with_the_reserved_cache(tiny_model_dir, room):
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 3, 11, 12, 13], [20, 21, 22, 23, 24], [3, 30, 31, 32, 33]])
    attn = (ids != 3).long()
    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=12, eos_token_id=2,
                           pad_token_id=3, return_dict_in_generate=True, output_scores=True)
    out = {}
    for name in ("default", "reserved"):
        cache = reserved_cache(model.config, ids.shape[1] + room) if name == "reserved" else None
        if name == "reserved":
            assert cache is not None and all(type(la) is ReservedLayer for la in cache.layers)
        torch.manual_seed(5)
        with torch.inference_mode():
            out[name] = model.generate(input_ids=ids, attention_mask=attn, generation_config=cfg, cache=cache)
    assert torch.equal(out["default"].sequences, out["reserved"].sequences)
    assert out["default"].sequences.shape[1] == ids.shape[1] + 12  # the batch ran all 12 steps
    for a, b in zip(out["default"].scores, out["reserved"].scores):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_sliding_window_model_keeps_transformers_cache():
    from transformers import MistralConfig

    cfg = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=128, sliding_window=16)
    assert reserved_cache(cfg, 32) is None
    cfg.sliding_window = None
    assert reserved_cache(cfg, 32) is not None


def test_growth_stops_at_the_limit_and_still_fits_what_comes():
    ours, ref = ReservedLayer(2, limit=7), DynamicLayer()
    rooms = []
    for k, v in _steps(2):  # 5, 6, 7, 9, 10 positions
        got, want = ours.update(k, v), ref.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        rooms.append(ours._k.shape[-2])
    assert rooms == [5, 7, 7, 9, 10]  # doubled up to the limit, then exactly what is needed
    with pytest.raises(ValueError, match="limit"):
        ReservedLayer(8, limit=7)


def test_offload_and_prefetch_keep_the_filled_part():
    ours = ReservedLayer(16)
    steps = _steps(3)
    for k, v in steps[:3]:
        ours.update(k, v)
    before = ours.keys.clone(), ours.values.clone()
    ours.offload(), ours.prefetch()  # on a CPU layer both stay put, the values intact
    assert torch.equal(ours.keys, before[0]) and torch.equal(ours.values, before[1])
    k, v = steps[3]
    assert torch.equal(ours.update(k, v)[0][..., :7, :], before[0])  # later writes land after them
    # a layer whose device is another (meta: shapes without data) is moved there, its views with it
    ours.device = torch.device("meta")
    ours.prefetch()
    assert ours.keys.device.type == ours.values.device.type == "meta" and ours.keys.shape == (3, 2, 9, 4)
    assert ours.get_seq_length() == 9
