"""transformers' own assisted loop with `DSparkCandidateGenerator` (`dspark_engine="transformers"`), the per-model
route that binding installs (no global patch), and bad input for both engines."""

from __future__ import annotations

import copy
import itertools
import pickle
import subprocess
import sys

import pytest
import torch
import _sampling
from _tiny_models import tiny_tokenizer
from conftest import CollectStreamer, make_tiny_drafter, make_tiny_target
from transformers import GenerationMixin, TextIteratorStreamer, pipeline
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper
from transformers.generation.stopping_criteria import StopStringCriteria

import hf_dspark
from hf_dspark.candidate_generator import DSparkCandidateGenerator
from hf_dspark.routing import is_routed
from hf_dspark.testing import oracle_drafts, ragged_batch

HF = dict(dspark_engine="transformers")
GREEDY = dict(max_new_tokens=30, do_sample=False, eos_token_id=None)


@pytest.fixture
def assisted_calls(monkeypatch):
    """Counts the calls of transformers' `_assisted_decoding` (which `_sample` and our loop never reach)."""
    calls = []
    real = GenerationMixin._assisted_decoding

    def spy(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "_assisted_decoding", spy)
    return calls


# ------------------------------------------------------------------------------------------------ no global patch
def test_import_leaves_generate_untouched():
    code = (
        "import transformers; g = transformers.GenerationMixin.generate; import hf_dspark; "
        "assert transformers.GenerationMixin.generate is g and transformers.LlamaForCausalLM.generate is g"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_binding_routes_that_model_instance_only(tiny_target):
    other = make_tiny_target(seed=1)
    assert not is_routed(tiny_target) and not is_routed(other)
    make_tiny_drafter(tiny_target)
    assert is_routed(tiny_target) and not is_routed(other)
    assert "generate" not in vars(other) and "_get_candidate_generator" not in vars(other)
    assert type(tiny_target).generate is GenerationMixin.generate
    assert is_routed(copy.deepcopy(tiny_target)) and is_routed(pickle.loads(pickle.dumps(tiny_target)))


def test_an_unbound_model_refuses_a_drafter_naming_the_fix(tiny_target):
    from hf_dspark import DSparkConfig, DSparkDrafter

    unbound = DSparkDrafter(DSparkConfig.from_target(tiny_target.config, mask_token_id=255, markov_rank=8))
    bound_elsewhere = make_tiny_drafter(make_tiny_target(seed=1))
    enc = ragged_batch(256, lengths=(4,))
    with pytest.raises(AttributeError, match=r"is not bound to a model.*drafter\.bind\(model\)"):
        tiny_target.generate(**enc, max_new_tokens=3, assistant_model=unbound)
    with pytest.raises(AttributeError, match=r"bound to another model.*target=model"):
        tiny_target.generate(**enc, max_new_tokens=3, assistant_model=bound_elsewhere)


# ------------------------------------------------------------------------------------------------ greedy exactness
def test_greedy_identical_in_transformers_loop(tiny_target, tiny_drafter, assisted_calls):
    enc = ragged_batch(256, lengths=(9,))
    ref = tiny_target.generate(**enc, **GREEDY)
    assert torch.equal(tiny_target.generate(**enc, **GREEDY, assistant_model=tiny_drafter, **HF), ref)
    assert len(assisted_calls) == 1
    with oracle_drafts(ref):
        out = tiny_target.generate(**enc, **GREEDY, assistant_model=tiny_drafter, **HF)
    assert torch.equal(out, ref)
    stats = tiny_drafter.last_stats
    assert stats.mean_accepted_length > 3.0 and stats.drafted_steps >= stats.steps - 1  # the last may have no room
    assert sum(stats.accepted_lengths) == 30 - 1  # every token but the prefill's comes from a step


def test_engines_agree_on_text_and_accepted_counts(tiny_target, tiny_drafter):
    enc = ragged_batch(256, lengths=(9,), seed=3)
    ref = tiny_target.generate(**enc, **GREEDY)
    # options, and the most drafts a step verifies (this drafter's confidences: 0.45-0.49, so 0.46 cuts blocks)
    cases = [({}, {7}), (dict(confidence_threshold=0.46), set(range(1, 7))), (dict(num_speculative_tokens=3), {3}), (dict(markov=False), {7})]
    for options, most in cases:
        runs = []
        for engine in ({}, HF):
            with oracle_drafts(ref, seed=1):
                out = tiny_target.generate(**enc, **GREEDY, assistant_model=tiny_drafter, adaptive_verification=False, **options, **engine)
            stats = tiny_drafter.last_stats
            runs.append((out, stats.accepted_lengths, stats.verified_lengths))
        assert torch.equal(runs[0][0], ref) and torch.equal(runs[1][0], ref), options
        assert runs[0][1:] == runs[1][1:], options
        assert sum(runs[1][1]) > len(runs[1][1]) and max(runs[1][2]) in most, options  # drafts were accepted


def test_streamer_receives_each_accepted_chunk(tiny_target, tiny_drafter):
    enc = ragged_batch(256, lengths=(7,), seed=4)
    ref = tiny_target.generate(**enc, **GREEDY)
    streamer = CollectStreamer()
    with oracle_drafts(ref):
        out = tiny_target.generate(**enc, **GREEDY, assistant_model=tiny_drafter, streamer=streamer, **HF)
    assert torch.equal(out, ref) and streamer.ended
    assert streamer.chunks[0] == enc["input_ids"][0].tolist()  # the prompt first, as transformers documents
    assert list(itertools.chain(*streamer.chunks[1:])) == out[0, 7:].tolist()
    assert [len(c) for c in streamer.chunks[2:]] == tiny_drafter.last_stats.accepted_lengths  # one chunk per step


# ------------------------------------------------------------------------------------------------ sampling exactness
V_SMALL, N_TOKENS = 6, 4  # the prefill samples the first token; one step then verifies up to 2 drafts and a bonus


@pytest.fixture(scope="module")
def small_vocab():
    """A 6-token target and drafter, a prompt, and the exact joint distribution of new tokens 2..4 (216 cells)."""
    target = make_tiny_target(seed=7, vocab_size=V_SMALL, eos_token_id=None, pad_token_id=0, bos_token_id=None)
    drafter = make_tiny_drafter(target, seed=8, mask_token_id=V_SMALL - 1, markov_rank=4)
    prompt = torch.tensor([[1, 2, 3, 4]])
    warpers = [TemperatureLogitsWarper(0.8), TopKLogitsWarper(4)]
    joint = _sampling.exact_joint(target, prompt, warpers, V_SMALL, N_TOKENS).view(V_SMALL, -1).sum(0)
    return target, drafter, prompt, joint


def sample_counts(target, drafter, prompt, samples: int, **kw) -> tuple[torch.Tensor, list[int]]:
    """Counts of new tokens 2..4 over `samples` calls of transformers' loop (batch 1), and the verified lengths."""
    torch.manual_seed(1234)
    counts, verified = torch.zeros(V_SMALL ** (N_TOKENS - 1)), []
    place = torch.tensor([V_SMALL**2, V_SMALL, 1])
    for _ in range(samples):
        out = target.generate(input_ids=prompt, max_new_tokens=N_TOKENS, do_sample=True, temperature=0.8, top_k=4,
                              assistant_model=drafter, **HF, **kw)
        counts[(out[0, -(N_TOKENS - 1) :] * place).sum()] += 1
        verified += drafter.last_stats.verified_lengths
    return counts, verified


@pytest.mark.parametrize("threshold", [None, 0.5])
def test_sampling_in_transformers_loop_matches_the_target_distribution(small_vocab, threshold):
    target, drafter, prompt, joint = small_vocab
    counts, verified = sample_counts(target, drafter, prompt, 1200, confidence_threshold=threshold)
    assert _sampling.chi_square_pvalue(counts, joint) > 1e-3
    assert max(verified) == (2 if threshold is None else 1)  # the threshold cuts every 2-draft block short


def test_the_sampling_test_catches_a_wrong_q(small_vocab, monkeypatch):
    """Returning a q other than the one the drafts were sampled from breaks transformers' rejection sampling."""
    target, drafter, prompt, joint = small_vocab
    real = DSparkCandidateGenerator.get_candidates

    def uniform_q(self, *args, **kwargs):
        ids, logits = real(self, *args, **kwargs)
        return ids, None if logits is None else torch.zeros_like(logits)

    monkeypatch.setattr(DSparkCandidateGenerator, "get_candidates", uniform_q)
    counts, _ = sample_counts(target, drafter, prompt, 500)
    assert _sampling.chi_square_pvalue(counts, joint) < 1e-6


# ------------------------------------------------------------------------------------------------ real SmolLM2
def chat(tok, prompt: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)


@pytest.mark.real
def test_real_smollm2_engines_agree_with_plain_generate(smollm2):
    """The shipped drafter, fp32, batch 1: both engines give plain generate()'s text and the same accepted counts;
    pipelines and transformers' text streamer work with transformers' loop."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.bench import default_drafter

    model, tok = smollm2
    drafter = DSparkDrafter.from_pretrained(default_drafter(), target=model)
    kw = dict(max_new_tokens=24, do_sample=False)
    for prompt, options in (("What is 7 + 5?", {}), ("Write a Python function that adds two numbers.", dict(confidence_threshold=0.5))):
        enc = tok([chat(tok, prompt)], return_tensors="pt")
        ref = model.generate(**enc, **kw)
        assert not torch.isin(ref[0, enc["input_ids"].shape[1] :], torch.tensor(model.generation_config.eos_token_id)).any()
        ours = model.generate(**enc, **kw, assistant_model=drafter, adaptive_verification=False, **options)
        ours_accepted = drafter.last_stats.accepted_lengths
        streamer = TextIteratorStreamer(tok, skip_prompt=True)
        theirs = model.generate(**enc, **kw, assistant_model=drafter, streamer=streamer, **HF, **options)
        assert torch.equal(ours, ref) and torch.equal(theirs, ref)
        assert drafter.last_stats.accepted_lengths == ours_accepted and drafter.last_stats.accepted_tokens > 0
        assert "".join(streamer) == tok.decode(ref[0, enc["input_ids"].shape[1] :])
    pipe = pipeline("text-generation", model=model, tokenizer=tok)
    text = chat(tok, "Name three colors.")
    assert pipe(text, assistant_model=drafter, **HF, **kw) == pipe(text, **kw)


@pytest.mark.real
def test_real_smollm2_stop_strings_are_checked_once_per_step(smollm2):
    """transformers' loop runs stop-string criteria once per step, on the end of the sequence (StopStringCriteria's
    documented rule): it stops at the first step whose last token ends a stop string, past the stop point when the
    string ends inside an accepted block (our loop cuts exactly there)."""
    model, tok = smollm2
    drafter = make_tiny_drafter(model, mask_token_id=16, markov_rank=32)
    enc = tok([chat(tok, "Count from one to twenty in words.")], return_tensors="pt")
    p = enc["input_ids"].shape[1]
    kw = dict(max_new_tokens=40, do_sample=False)
    full = model.generate(**enc, **kw)
    stop = tok.decode(full[0, p:]).split()[4]
    with oracle_drafts(full, seed=2):
        model.generate(**enc, **kw, assistant_model=drafter, **HF)
    ends = list(itertools.accumulate([p + 1] + drafter.last_stats.accepted_lengths))  # sequence length after each step
    criteria = StopStringCriteria(tok, [stop])
    expected = next((n for n in ends if criteria(full[:, :n], None).item()), full.shape[1])
    with oracle_drafts(full, seed=2):
        out = model.generate(**enc, **kw, assistant_model=drafter, stop_strings=[stop], tokenizer=tok, **HF)
    assert torch.equal(out, full[:, :expected])
    exact = model.generate(**enc, **kw, stop_strings=[stop], tokenizer=tok, assistant_model=drafter)
    assert torch.equal(exact, model.generate(**enc, **kw, stop_strings=[stop], tokenizer=tok))
    assert torch.equal(out[:, : exact.shape[1]], exact)


# ------------------------------------------------------------------------------------------------ bad input
ENGINES = pytest.mark.parametrize("engine", [{}, HF], ids=["dspark", "transformers"])


@ENGINES
def test_drafter_bound_to_another_model_is_refused(tiny_target, tiny_drafter, engine):
    other = make_tiny_drafter(make_tiny_target(seed=1))
    with pytest.raises(ValueError, match="bound to a different target"):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, assistant_model=other, **engine)


@ENGINES
def test_an_assistant_tokenizer_other_than_the_targets_is_refused(tiny_target, tiny_drafter, engine):
    tok, other = tiny_tokenizer(), tiny_tokenizer()
    other.add_tokens(["<extra>"])
    enc = ragged_batch(256, lengths=(4,))
    with pytest.raises(ValueError, match="assistant_tokenizer= must be the target's tokenizer"):
        tiny_target.generate(**enc, max_new_tokens=3, assistant_model=tiny_drafter, tokenizer=tok, assistant_tokenizer=other, **engine)
    ref = tiny_target.generate(**enc, max_new_tokens=5, do_sample=False)
    out = tiny_target.generate(**enc, max_new_tokens=5, do_sample=False, assistant_model=tiny_drafter, tokenizer=tok,
                               assistant_tokenizer=tiny_tokenizer(), **engine)
    assert torch.equal(out, ref)  # the target's own tokenizer (an equal copy) is accepted


@ENGINES
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_beams=2), "beam search; set num_beams=1"),
        (dict(cache_implementation="static"), "dynamic cache, got StaticCache; drop cache_implementation"),
        (dict(guidance_scale=1.5), "Drop guidance_scale"),
    ],
    ids=["beams", "static_cache", "guidance"],
)
def test_unsupported_settings_are_refused_in_both_engines(tiny_target, tiny_drafter, engine, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, assistant_model=tiny_drafter, **engine, **kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dspark_engine="vllm"), "dspark_engine must be 'dspark'"),
        (dict(dspark_engine="transformers", adaptive_verification=True), "run in our loop only"),
        (dict(dspark_engine="transformers", num_speculative_tokens=9), "num_speculative_tokens=9 must be in"),
    ],
)
def test_bad_engine_options_are_refused(tiny_target, tiny_drafter, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, assistant_model=tiny_drafter, **kwargs)


def test_dspark_engine_without_a_drafter_is_refused(tiny_target, tiny_drafter):
    with pytest.raises(ValueError, match="pass assistant_model=<DSparkDrafter>"):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, **HF)


def test_batches_are_refused_by_transformers_loop(tiny_target, tiny_drafter):
    with pytest.raises(ValueError, match="one prompt at a time; drop dspark_engine='transformers'"):
        tiny_target.generate(**ragged_batch(256), max_new_tokens=3, assistant_model=tiny_drafter, **HF)
