"""The benchmark tool's input handling and reporting (the benchmark itself is run by `hf-dspark bench`)."""

import json

import pytest
import torch

from hf_dspark import bench
from hf_dspark.cli import build_parser, main


def test_contenders_and_batch_sizes_are_checked():
    assert bench.parse_contenders("dspark,plain") == ["plain", "dspark"]  # plain always runs first
    assert bench.parse_contenders("dspark") == ["plain", "dspark"]
    with pytest.raises(ValueError, match="choose from plain, prompt_lookup, hf_dflash, dflash, dspark, dspark_no_copy, dspark_adaptive, dspark_tree, dspark_tree_lookup, dspark_hf_loop, dspark_default"):
        bench.parse_contenders("dspark,medusa")
    assert bench.parse_batch_sizes("1,4,16") == [1, 4, 16]
    for bad in ("0", "1,-4", "one", ""):
        with pytest.raises(ValueError, match="positive integers"):
            bench.parse_batch_sizes(bad)


def test_prompt_sets(tmp_path):
    for name in bench.PROMPT_SETS:
        prompts = bench.load_prompts(name, 5)
        assert len(prompts) == 5 and all(isinstance(p, str) and p for p in prompts)
    assert len(bench.load_prompts("gsm8k", 150)) == 150  # cycled past the 100 GSM8K questions
    with pytest.raises(ValueError, match="gsm8k, humaneval, mtbench"):
        bench.load_prompts("mmlu", 3)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"answer": 3}) + "\n")
    with pytest.raises(ValueError, match="no string field"):
        bench.load_prompts(str(bad), 3)
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": "hello"}) + "\n")
    assert bench.load_prompts(str(good), 2) == ["hello", "hello"]


def test_cli_reports_bad_input_clearly(capsys):
    assert main(["bench", "--contenders", "nope"]) == 2
    assert "Unknown contender" in capsys.readouterr().err
    assert main(["bench", "--batch-sizes", "0"]) == 2
    assert "positive integers" in capsys.readouterr().err
    assert main(["bench", "--prompts", "mmlu"]) == 2
    assert "Unknown prompt set" in capsys.readouterr().err
    assert main(["bench", "--synthetic-acceptance", "1.5"]) == 2
    assert "(0, 1)" in capsys.readouterr().err
    assert main(["bench", "--synthetic-acceptance", "0.8", "--contenders", "plain,hf_dflash"]) == 2
    assert "our drafter's chain contenders" in capsys.readouterr().err
    assert main(["bench", "--temperature", "-1"]) == 2
    assert "--temperature must be >= 0" in capsys.readouterr().err
    assert main(["bench", "--temperature", "0.7", "--synthetic-acceptance", "0.8", "--contenders", "plain,dspark"]) == 2
    assert "drop it or --temperature" in capsys.readouterr().err


def test_cli_help_lists_every_command():
    text = build_parser().format_help()
    for cmd in ("bench", "profile", "export", "make-data", "train", "calibrate", "finetune"):
        assert cmd in text


def test_table_and_plots(tmp_path):
    recs = [
        bench.Record("plain", "gsm8k", 1, tokens_per_s=40.0, speedup_vs_plain=1.0, identical_to_plain=True),
        bench.Record("dspark", "gsm8k", 1, tokens_per_s=80.0, speedup_vs_plain=2.0, speedup_range=[1.5, 2.5],
                     decode_speedup_vs_plain=2.5, ttft_s=0.25, scheduler_ms_per_step=0.05, mean_accepted_length=3.1, p_slower=1.0,
                     per_position_acceptance=[0.8, 0.6], verified_drafts_per_request=7.0, identical_to_plain=True),
        bench.Record("dflash", "gsm8k", 1, tokens_per_s=60.0, speedup_vs_plain=1.5, mean_accepted_length=2.5,
                     per_position_acceptance=[0.7, 0.5], verified_drafts_per_request=7.0, identical_to_plain=True),
        bench.Record("prompt_lookup", "gsm8k", 4, supported=False, reason=bench.BATCH_1_ONLY["prompt_lookup"]),
    ]
    table = bench.markdown_table(recs)
    assert "| gsm8k | 1 | dspark | 80.0 | 2.00x [1.50-2.50] | 1.000 | 2.50x | 0.25 | 3.10 | 7.00 | 0.050 | yes |" in table
    assert "| gsm8k | 1 | plain | 40.0 | 1.00x | - | - | - | - | - | - | yes |" in table  # a record from an older JSON
    assert "| gsm8k | 4 | prompt_lookup | unsupported |" in table
    written = bench.plot(recs, tmp_path)
    assert len(written) == 3 and all(p.stat().st_size > 1000 for p in written)


def test_exactness_note_explains_bf16_and_flags_fp32():
    same = bench.Record("dspark", "gsm8k", 1, identical_to_plain=True)
    differs = bench.Record("dflash", "gsm8k", 1, identical_to_plain=False)
    unsupported = bench.Record("prompt_lookup", "gsm8k", 4, supported=False)
    assert bench.exactness_note([same, unsupported], torch.bfloat16) is None
    note = bench.exactness_note([same, differs], torch.bfloat16)
    assert "dflash" in note and "bfloat16 rounding" in note and "--dtype float32" in note and "dspark" not in note
    warning = bench.exactness_note([same, differs], torch.float32)
    assert warning.startswith("WARNING: dflash") and "bug" in warning


def test_paired_speedup():
    plain = [[2.0, 4.0], [3.0, 4.0]]  # [pass][batch] seconds
    other = [[1.0, 4.0], [2.0, 8.0]]
    assert bench.paired_speedup(plain, other) == (1.25, 0.5, 2.0)  # ratios 2, 1, 1.5, 0.5
    nan = bench.paired_speedup([], [])
    assert all(x != x for x in nan)


def test_run_interleaves_calls_and_splits_prefill(smollm2, monkeypatch):
    """Bench.run on real SmolLM2: every batch runs every contender back to back in a rotating order; the time to
    first token is the prefill; outputs match plain."""
    from hf_dspark.modeling import DSparkDrafter

    model, tok = smollm2
    drafter = DSparkDrafter.from_pretrained(str(bench.default_drafter()), target=model)
    order = []
    runner = bench.Bench.runner

    def spy(self, contender):
        run = runner(self, contender)
        return lambda enc: (order.append(contender), run(enc))[1]

    monkeypatch.setattr(bench.Bench, "runner", spy)
    b = bench.Bench(model, tok, drafter, max_new_tokens=4)
    plain, dspark = b.run("gsm8k", bench.load_prompts("gsm8k", 2), 1, ["plain", "dspark"], repeats=2)
    # 2 untimed reference calls, 2 warm-ups, then per pass and batch both contenders, the first one rotating
    assert order[-8:] == ["plain", "dspark", "dspark", "plain", "plain", "dspark", "dspark", "plain"]
    for rec in (plain, dspark):
        assert len(rec.calls_s) == 2 and all(len(p) == 2 for p in rec.calls_s)
        assert all(0 < t < c for tp, cp in zip(rec.calls_ttft_s, rec.calls_s) for t, c in zip(tp, cp))
        assert rec.identical_to_plain and rec.new_tokens == 8
        assert rec.repeats_s == [sum(p) for p in rec.calls_s]
    assert plain.speedup_vs_plain == 1.0 and plain.speedup_range == [1.0, 1.0]
    lo, hi = dspark.speedup_range
    assert lo <= dspark.speedup_vs_plain <= hi and dspark.decode_speedup_vs_plain > 0
    assert dspark.verified_drafts_per_request > 0 and plain.verified_drafts_per_request != plain.verified_drafts_per_request
    assert dspark.scheduler_ms_per_step >= 0 and plain.scheduler_ms_per_step != plain.scheduler_ms_per_step
    assert len(dspark.step_trace) == 2 and all(len(calls) == 2 for calls in dspark.step_trace)  # [pass][call][step]
    assert all(len(steps) >= 1 and steps[0][0] == 1 for calls in dspark.step_trace for steps in calls)
    assert plain.step_trace == []


def test_bench_times_custom_runners_and_checks_their_outputs(smollm2):
    """A named custom runner is timed and compared with plain like a built-in contender; built-in names are kept."""
    model, tok = smollm2
    with pytest.raises(ValueError, match="built-in"):
        bench.Bench(model, tok, None, custom_runners={"plain": lambda enc: None})

    def off_by_one(enc):  # plain output with its last token changed: must be reported as not identical
        out = model.generate(**enc, max_new_tokens=3, do_sample=False).clone()
        out[:, -1] = (out[:, -1] + 1) % model.config.vocab_size
        return out

    b = bench.Bench(model, tok, None, max_new_tokens=3, custom_runners={"off_by_one": off_by_one})
    plain, custom = b.run("gsm8k", bench.load_prompts("gsm8k", 1), 1, ["plain", "off_by_one"], repeats=1)
    assert custom.contender == "off_by_one" and len(custom.calls_s) == 1 and custom.calls_s[0][0] > 0
    assert plain.identical_to_plain and custom.identical_to_plain is False


def test_slower_p_value_is_the_exact_signed_rank_tail():
    one_pass = lambda xs: [xs]  # noqa: E731  one pass of len(xs) batches
    # contender slower on all 3 pairs: only that sign pattern (of 8) has W+ = 0
    assert bench.slower_p_value(one_pass([1.0, 1.0, 1.0]), one_pass([1.1, 1.2, 1.3])) == pytest.approx(1 / 8)
    # faster on the pair of smallest |log ratio| only: W+ = 1, patterns with W+ <= 1: {}, {1}
    assert bench.slower_p_value(one_pass([1.0, 1.0, 1.0]), one_pass([0.99, 1.2, 1.3])) == pytest.approx(2 / 8)
    assert bench.slower_p_value(one_pass([1.0] * 10), one_pass([0.9] * 10)) == 1.0  # faster everywhere
    assert bench.slower_p_value(one_pass([1.0] * 10), one_pass([1.1] * 10)) == pytest.approx(2**-10)
    p = bench.slower_p_value(one_pass([1.0, 1.0]), one_pass([1.0, 1.0]))
    assert p != p  # only ties: no evidence either way (NaN)


def test_transformers_loop_contenders_match_plain(smollm2):
    """transformers' own loops driving our drafter -- native DFlash through NativeDFlashAssistant, assisted decoding
    through DSparkCandidateGenerator -- reproduce plain generate(); the latter reports its acceptance."""
    from hf_dspark.modeling import DSparkDrafter

    model, tok = smollm2
    drafter = DSparkDrafter.from_pretrained(str(bench.default_drafter()), target=model)
    b = bench.Bench(model, tok, drafter, max_new_tokens=12)
    plain, native, hf_loop = b.run("gsm8k", bench.load_prompts("gsm8k", 2), 1, ["plain", "hf_dflash", "dspark_hf_loop"], repeats=1)
    assert native.supported and native.identical_to_plain and native.new_tokens == plain.new_tokens == 24
    assert hf_loop.supported and hf_loop.identical_to_plain and hf_loop.new_tokens == 24
    assert hf_loop.mean_accepted_length >= 1.0 and len(hf_loop.per_position_acceptance) == drafter.config.block_size


def test_sampled_bench_compares_no_texts_and_is_seeded(smollm2):
    """With a temperature every contender samples, the table says "-" under identical, and the same seed draws the
    same texts again."""
    from hf_dspark.modeling import DSparkDrafter

    model, tok = smollm2
    drafter = DSparkDrafter.from_pretrained(str(bench.default_drafter()), target=model)
    b = bench.Bench(model, tok, drafter, max_new_tokens=10, temperature=0.7, seed=3)
    prompts = bench.load_prompts("mtbench", 2)
    plain, tree = b.run("mtbench", prompts, 2, ["plain", "dspark_default"], repeats=1)
    assert plain.new_tokens > 0 and tree.new_tokens > 0 and tree.mean_accepted_length >= 1.0
    assert plain.identical_to_plain is None and tree.identical_to_plain is None
    assert bench.markdown_table([plain, tree]).splitlines()[-1].endswith("| - |")
    enc = b.encode(prompts)
    torch.manual_seed(5)
    first = b.runner("dspark_default")(enc)
    torch.manual_seed(5)
    assert torch.equal(b.runner("dspark_default")(enc), first)


def test_tree_contender_matches_plain_and_refuses_synthetic_drafts(smollm2):
    """`dspark_tree` verifies a draft tree of --tree-size drafts: plain generate()'s tokens, its tau reported."""
    from hf_dspark.modeling import DSparkDrafter

    model, tok = smollm2
    drafter = DSparkDrafter.from_pretrained(str(bench.default_drafter()), target=model)
    b = bench.Bench(model, tok, drafter, max_new_tokens=12, tree_size=5)
    _, tree = b.run("gsm8k", bench.load_prompts("gsm8k", 2), 2, ["plain", "dspark_tree"], repeats=1)
    assert tree.supported and tree.identical_to_plain and tree.mean_accepted_length >= 1.0
    assert main(["bench", "--contenders", "dspark_tree", "--synthetic-acceptance", "0.5"]) == 2
