"""Training memory bounded by design (issue 53, part 3): log-probs and entropies computed in chunks
of policy tokens equal the unchunked ones (values and LoRA gradients), no ``[N, V]`` tensor is kept
for the backward pass, and micro-batches are sized by a padded-token budget without changing the
update; long micro-batches without a shared prompt run with their decoder layers checkpointed,
automatically, with the same values and gradients."""

import pytest
import torch

from tasks.config import RunConfig
from tasks.train.forward import layer_checkpointing, micro_batches, pad_batch, prefix_len, sequence_logprobs
from tasks.train.logprobs import chunked_logprobs, entropy_from_logits, token_logprobs
from tasks.train.loops import train
from tasks.train.sequences import TrainSequence
from tasks.train.trainer import Trainer
from tests.train.test_trainer import _cfg, _fp32, _quiet, _seqs

KEYS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.8, 20, 1.0), (1.0, 0, 0.9), (1.3, 7, 0.85)]


def _multi_turn(n_prompts=3, samples=3, seed=3, key=(1.0, 0, 1.0)):
    """Groups sharing a prompt, completions of different lengths, an observation between two turns."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for p in range(n_prompts):
        prompt = torch.randint(5, 1000, (5 + 2 * p,), generator=g).tolist()
        for k in range(samples):
            comp = torch.randint(5, 1000, (6 + 3 * k,), generator=g).tolist()
            obs = torch.randint(5, 1000, (3,), generator=g).tolist()
            ids = prompt + comp + obs + comp[:4]
            mask = [0] * len(prompt) + [1] * len(comp) + [0] * 3 + [1] * 4
            seqs.append(TrainSequence(f"{p}{k}", ids, mask, [0.0] * len(ids), float(k % 2), f"t{p}", f"h{p}", "H", key))
    return seqs


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    return Trainer(_fp32(_cfg(tiny_model_dir)), tiny_model_dir, log=_quiet)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("shared", [False, True])
def test_chunked_logprobs_entropy_and_lora_gradients_equal_the_unchunked(trainer, key, shared):
    tr = trainer
    seqs = _multi_turn(key=key)
    idx = list(range(len(seqs)))
    ids, attn, mask, _ = pad_batch(seqs, idx, tr.pad_id)
    n_policy = int(mask.sum())
    assert n_policy > 4 * 7  # several chunks of 7, the last one partial
    kw = {"prefix_lens": [prefix_len(seqs[i]) for i in idx], "pad_id": tr.pad_id} if shared else {}
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask

    def run(chunk):
        tr.model.zero_grad()
        lp, ent = sequence_logprobs(tr.model, ids, attn, mask, key, tr.ac, with_entropy=True, chunk_tokens=chunk, **kw)
        # a loss that weights every token differently, -inf (outside the top-k/top-p support) left out
        (torch.where(torch.isfinite(lp), lp, 0.0) * weights).sum().backward()
        return lp.detach(), ent, [p.grad.clone() for p in tr.params]

    lp0, e0, g0 = run(0)
    lp1, e1, g1 = run(7)
    assert ((lp0 != 0) | torch.isinf(lp0)).sum() == n_policy  # every policy token has a value
    assert torch.equal(torch.isinf(lp0), torch.isinf(lp1))
    fin = torch.isfinite(lp0)
    assert torch.allclose(lp0[fin], lp1[fin], atol=1e-5, rtol=0) and torch.allclose(e0, e1, atol=1e-5, rtol=0)
    assert (e0 * mask).sum() > 0 and (e0 * (1 - mask)).abs().sum() == 0  # entropies at policy tokens only
    assert any(g.abs().sum() > 0 for g in g0)  # the LoRA weights do get a gradient
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4), (a - b).abs().max()


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_logprobs_equal_token_logprobs_on_random_logits(chunk):
    """The function alone, with a trainable head: values, entropies and both gradients."""
    g = torch.Generator().manual_seed(0)
    hidden0, weight0 = torch.randn(37, 16, generator=g), torch.randn(300, 16, generator=g)
    targets = torch.randint(0, 300, (37,), generator=g)
    out = []
    for chunked in (False, True):
        hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        if chunked:
            lp, ent = chunked_logprobs(hidden, lambda h: h @ weight.T, targets, temperature=0.8, top_k=50, chunk=chunk,
                                       with_entropy=True)
        else:
            logits = hidden @ weight.T
            lp = token_logprobs(logits, targets, temperature=0.8, top_k=50)
            ent = entropy_from_logits(logits.detach(), temperature=0.8)
        torch.where(torch.isfinite(lp), lp, 0.0).sum().backward()
        out.append((lp.detach(), ent, hidden.grad, weight.grad))
    (lp0, e0, gh0, gw0), (lp1, e1, gh1, gw1) = out
    assert torch.isinf(lp0).any() and torch.equal(torch.isinf(lp0), torch.isinf(lp1))  # top-k cuts some targets
    fin = torch.isfinite(lp0)
    assert torch.allclose(lp0[fin], lp1[fin], atol=1e-5) and torch.allclose(e0, e1, atol=1e-5)
    assert torch.allclose(gh0, gh1, atol=1e-5) and torch.allclose(gw0, gw1, atol=1e-5)


def test_no_tensor_as_wide_as_the_vocabulary_over_the_whole_micro_batch_is_kept_for_backward(trainer):
    """What autograd saves for the backward pass, outside the per-chunk recomputation: the
    unchunked path keeps ``[N, V]`` tensors, the chunked one none wider than its chunk."""
    tr = trainer
    seqs = _multi_turn(key=(0.8, 20, 0.9))
    ids, attn, mask, _ = pad_batch(seqs, list(range(len(seqs))), tr.pad_id)
    head_w = tr.model.get_base_model().get_output_embeddings().weight
    vocab = head_w.shape[0]
    n_policy = int(mask.sum())

    def saved_rows_of_vocab_width(chunk):
        rows = []

        def pack(t):
            is_head = t.untyped_storage().data_ptr() == head_w.untyped_storage().data_ptr()  # its weight (or .T)
            if t.dim() >= 1 and t.shape[-1] == vocab and not is_head:
                rows.append(t.numel() // vocab)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp, _ = sequence_logprobs(tr.model, ids, attn, mask, (0.8, 20, 0.9), tr.ac, with_entropy=True,
                                      chunk_tokens=chunk)
        torch.where(torch.isfinite(lp), lp, 0.0).sum().backward()
        return rows

    assert max(saved_rows_of_vocab_width(0)) == n_policy
    assert saved_rows_of_vocab_width(8) == []
    # the LM head (tied to the embeddings) is frozen under LoRA: only hidden states need a gradient
    assert not tr.model.get_base_model().get_output_embeddings().weight.requires_grad


def test_chunked_logprobs_refuse_bad_input():
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        chunked_logprobs(torch.zeros(2, 3), lambda h: h, torch.zeros(2, dtype=torch.long), chunk=0)
    with pytest.raises(ValueError, match="do not line up"):
        chunked_logprobs(torch.zeros(2, 3), lambda h: h, torch.zeros(3, dtype=torch.long))
    lp, ent = chunked_logprobs(torch.zeros(0, 3), lambda h: h, torch.zeros(0, dtype=torch.long), with_entropy=True)
    assert lp.shape == (0,) and ent.shape == (0,)


# ---- micro-batches by a token budget ---------------------------------------------------------------

def _lengths(lengths, prompts=None):
    prompts = prompts or list(range(len(lengths)))
    return [TrainSequence(f"e{i}", [100 + p] + [7] * (n - 1), [0] + [1] * (n - 1), [0.0] * n, 0.0, "t", "h", "H",
                          (1.0, 0, 1.0)) for i, (n, p) in enumerate(zip(lengths, prompts))]


def test_micro_batches_stay_within_the_token_budget_and_a_long_sequence_trains_alone():
    seqs = _lengths([10, 30, 12, 100, 11, 29, 31])
    mbs = micro_batches(seqs, None, 64)
    # by length: 10, 11, 12 | 29, 30 (2 x 30 = 60) | 31 | 100 alone (over the budget)
    assert [[len(seqs[i].ids) for i in mb] for mb in mbs] == [[10, 11, 12], [29, 30], [31], [100]]
    assert sorted(i for mb in mbs for i in mb) == list(range(len(seqs)))
    for mb in mbs:
        assert len(mb) * max(len(seqs[i].ids) for i in mb) <= 64 or len(mb) == 1
    # the count still caps; without either limit, one micro-batch
    by_two = micro_batches(seqs, 2, 64)
    assert [[len(seqs[i].ids) for i in mb] for mb in by_two] == [[10, 11], [12, 29], [30, 31], [100]]
    assert micro_batches(seqs, None, None) == [[0, 4, 2, 5, 1, 6, 3]]
    with pytest.raises(ValueError, match="token budget must be >= 1, got 0"):
        micro_batches(seqs, None, 0)


def test_micro_batches_keep_a_prompts_samples_side_by_side():
    seqs = _lengths([20, 8, 21, 9, 22], prompts=[0, 1, 0, 1, 0])
    mbs = micro_batches(seqs, None, 50)
    # prompt 1 (longest sample 8... sorted by its first sample's length) then prompt 0
    assert [[seqs[i].ids[0] for i in mb] for mb in mbs] == [[101, 101], [100, 100], [100]]


@pytest.mark.parametrize("algorithm,agg", [("grpo", "token_mean"), ("gspo", "seq_mean_token_mean")])
def test_the_gradient_does_not_depend_on_the_token_budget(tiny_model_dir, tmp_path, algorithm, agg):
    seqs = _multi_turn(n_prompts=2, samples=4)
    longest = max(len(s.ids) for s in seqs)
    kw = dict(algorithm=algorithm, agg=agg, micro_batch_size=64, logprob_chunk_tokens=16,
              kl={"estimator": "k2", "placement": "loss", "beta": 0.2})
    assert len(micro_batches(seqs, 64, 2 * longest)) > len(micro_batches(seqs, 64, 100_000)) == 1
    out = []
    for budget in (100_000, 2 * longest):
        tr = Trainer(_fp32(_cfg(tiny_model_dir, micro_batch_tokens=budget, **kw)), tiny_model_dir, log=_quiet)
        b = tr.new_batch(seqs)
        for _ in range(2):  # the second step off-policy: ratios, clipping and the KL term all act
            row, _ = tr.step(b, list(range(len(seqs))))
        out.append((row, [p.grad.clone() for p in tr.params]))
    (ra, ga), (rb, gb) = out
    assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5, abs=1e-7) and ra["grad_norm"] > 0
    assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-5)
    for x, y in zip(ga, gb, strict=True):
        assert torch.allclose(x, y, atol=1e-7, rtol=1e-4), (x - y).abs().max()


# ---- automatic activation checkpointing ----------------------------------------------------------

def _saved_and_recomputed(tr, ids, attn, mask, key, checkpointed, chunk=7):
    """One forward + backward of ``sequence_logprobs`` (chunked): layers switched on, elements
    autograd saved in the forward (outside the chunks' own checkpoint), calls into the layers'
    MLPs over forward and backward (pre-hooks: a recomputation stops once it has what the
    backward needs), log-probs, entropies and LoRA gradients."""
    mlps = [m for n, m in tr.model.named_modules() if n.endswith("mlp")]
    calls = []
    hooks = [m.register_forward_pre_hook(lambda *a: calls.append(1)) for m in mlps]
    saved = []
    tr.model.zero_grad()
    try:
        with layer_checkpointing(tr.model, checkpointed) as n_on:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
                lp, ent = sequence_logprobs(tr.model, ids, attn, mask, key, tr.ac, with_entropy=True,
                                            chunk_tokens=chunk)
        weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2)) * mask
        (torch.where(torch.isfinite(lp), lp, 0.0) * weights).sum().backward()
    finally:
        for h in hooks:
            h.remove()
    return n_on, sum(saved), len(calls), len(mlps), lp.detach(), ent, [p.grad.clone() for p in tr.params]


@pytest.mark.parametrize("key", [(1.0, 0, 1.0), (0.8, 20, 0.9)])
def test_layer_checkpointing_recomputes_the_layers_with_the_same_values_and_lora_gradients(trainer, key):
    tr = trainer  # a peft (LoRA) model; the log-probs chunked
    seqs = _multi_turn(key=key)
    ids, attn, mask, _ = pad_batch(seqs, list(range(len(seqs))), tr.pad_id)
    n0, saved0, calls0, n_layers, lp0, e0, g0 = _saved_and_recomputed(tr, ids, attn, mask, key, False)
    n1, saved1, calls1, _, lp1, e1, g1 = _saved_and_recomputed(tr, ids, attn, mask, key, True)
    assert n0 == 0 and n1 == n_layers >= 2
    assert calls0 == n_layers and calls1 == 2 * n_layers  # each layer run again in the backward pass
    assert saved1 < saved0 / 3  # the forward kept each layer's input, not its activations
    assert torch.equal(lp0, lp1) and torch.equal(e0, e1)
    assert any(g.abs().sum() > 0 for g in g0)
    for x, y in zip(g0, g1, strict=True):
        assert torch.allclose(x, y, atol=1e-7, rtol=1e-5), (x - y).abs().max()
    # the layers are as they were: the next forward saves its activations again
    assert not any(getattr(m, "gradient_checkpointing", False) for m in tr.model.modules())
    assert _saved_and_recomputed(tr, ids, attn, mask, key, False)[1] == saved0


def test_layer_checkpointing_leaves_an_explicitly_checkpointed_model_checkpointed(tiny_model_dir):
    tr = Trainer(_fp32(_cfg(tiny_model_dir, gradient_checkpointing=True, share_prompt=False)), tiny_model_dir,
                 log=_quiet)
    with layer_checkpointing(tr.model) as n_on:
        assert n_on == 0
    layers = [m for m in tr.model.modules() if type(m).__name__.endswith("DecoderLayer")]
    assert layers and all(m.gradient_checkpointing for m in layers)
    with pytest.raises(ValueError, match="no checkpointable decoder layer"):
        with layer_checkpointing(torch.nn.Linear(2, 2)):
            pass


def test_the_automatic_choice_checkpoints_long_unshared_forwards_only(trainer):
    tr = trainer
    seqs = _multi_turn(n_prompts=2, samples=3)  # each prompt repeated 3 times
    group, single = [0, 1, 2], [0]
    shared = tr._prefix_kw(seqs, group)
    assert shared and tr._prefix_kw(seqs, single) == {}
    ids_g, ids_1 = pad_batch(seqs, group, tr.pad_id)[0], pad_batch(seqs, single, tr.pad_id)[0]
    n = tr.tc.checkpoint_tokens
    assert n == 512
    assert not tr._auto_checkpoint(ids_1, {})  # short: under the default threshold
    small = tr.tc.model_copy(update={"checkpoint_above_tokens": ids_1.numel() - 1})
    tr.tc, saved_tc = small, tr.tc
    try:
        assert tr._auto_checkpoint(ids_1, {})  # one token over the threshold
        assert not tr._auto_checkpoint(ids_g, shared)  # a shared-prompt forward never
        assert tr._auto_checkpoint(ids_g, {})
        tr.tc = small.model_copy(update={"checkpoint_above_tokens": ids_1.numel()})
        assert not tr._auto_checkpoint(ids_1, {})  # at the threshold: not above it
        tr.tc = small.model_copy(update={"checkpoint_above_tokens": 0})
        assert not tr._auto_checkpoint(ids_g, {})  # 0: never
    finally:
        tr.tc = saved_tc


@pytest.mark.parametrize("share_prompt", [True, False])
def test_automatic_checkpointing_leaves_the_update_unchanged(tiny_model_dir, share_prompt):
    """A training step with every long unshared micro-batch checkpointed against the same step
    with none: the same loss, gradient norm and LoRA gradients; with ``share_prompt`` the groups'
    micro-batches share their prompt and are not checkpointed, a lone sequence is."""
    seqs = _multi_turn(n_prompts=2, samples=3) + _multi_turn(n_prompts=1, samples=1, seed=9)
    kw = dict(algorithm="gspo", agg="seq_mean_token_mean", micro_batch_size=3, logprob_chunk_tokens=16,
              share_prompt=share_prompt, kl={"estimator": "k2", "placement": "loss", "beta": 0.2})
    out = []
    for above in (0, 8):
        tr = Trainer(_fp32(_cfg(tiny_model_dir, checkpoint_above_tokens=above, **kw)), tiny_model_dir, log=_quiet)
        b = tr.new_batch(seqs)
        for _ in range(2):  # the second step off-policy: ratios, clipping and the KL term all act
            row, _ = tr.step(b, list(range(len(seqs))))
        mbs = tr._micro_batches(seqs)
        out.append((row, [p.grad.clone() for p in tr.params], tr.checkpointed_forwards, len(mbs)))
    (ra, ga, ca, n_mb), (rb, gb, cb, _) = out
    assert ca == 0
    # per step: every micro-batch (share_prompt off), or only the lone sequence's (on)
    assert cb == 2 * (n_mb if not share_prompt else 1)
    assert ra["grad_norm"] > 0 and ra["loss"] == pytest.approx(rb["loss"], rel=1e-6, abs=1e-8)
    assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-6)
    for x, y in zip(ga, gb, strict=True):
        assert torch.allclose(x, y, atol=1e-8, rtol=1e-5), (x - y).abs().max()


# ---- config ------------------------------------------------------------------------------------------

def _run(train_section):
    return RunConfig.model_validate({"name": "t", "suites": [{"name": "basic_arithmetic", "size": 2}],
                                     "harnesses": ["direct"], "train": train_section})


def test_config_defaults_bound_memory_and_unset_options_keep_the_hash():
    plain = _run({"micro_batch_size": 16})
    assert plain.train.micro_tokens == 1536 and plain.train.chunk_tokens == 256
    assert plain.train.checkpoint_tokens == 512
    dump = plain.model_dump(mode="json")["train"]
    assert not {"micro_batch_tokens", "logprob_chunk_tokens", "checkpoint_above_tokens"} & set(dump)  # old hashes
    set_ = _run({"micro_batch_size": 16, "micro_batch_tokens": 2048, "logprob_chunk_tokens": 0})
    assert set_.train.micro_tokens == 2048 and set_.train.chunk_tokens == 0
    never = _run({"micro_batch_size": 16, "checkpoint_above_tokens": 0})
    assert never.train.checkpoint_tokens == 0 and never.config_hash() != plain.config_hash()
    # the automatic choice never checkpoints a shared-prompt forward: it combines with share_prompt,
    # where the explicit option still refuses
    assert _run({"share_prompt": True, "checkpoint_above_tokens": 64}).train.checkpoint_tokens == 64
    with pytest.raises(ValueError, match="gradient_checkpointing cannot be combined with train.share_prompt"):
        _run({"share_prompt": True, "gradient_checkpointing": True})
    assert set_.config_hash() != plain.config_hash()
    for bad, msg in (({"micro_batch_tokens": 0}, "micro_batch_tokens"), ({"logprob_chunk_tokens": -1},
                                                                          "logprob_chunk_tokens"),
                     ({"checkpoint_above_tokens": -1}, "checkpoint_above_tokens")):
        with pytest.raises(ValueError, match=msg):
            _run(bad)
