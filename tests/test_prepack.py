"""Prepacked CPU linear layers (hf_dspark.prepack), fp32 and bf16: same results, batch-invariant rows, safe fallbacks."""

import copy

import pytest
import torch
from torch import nn

import hf_dspark
from hf_dspark import prepack
from hf_dspark.prepack import MAX_PACKED_ROWS, PrepackedLinear, is_prepacked, packs_bf16, prepacking_available
from hf_dspark.step_table import InvalidStepTableError, StepTimeTable, linear_kernels

from _tiny_models import tiny_drafter, tiny_target

pytestmark = pytest.mark.skipif(not prepacking_available(), reason="this torch build has no oneDNN")


def two_layers(bias: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96, bias=bias), nn.SiLU(), nn.Linear(96, 48, bias=bias)).eval()


@pytest.mark.parametrize("bias", [True, False])
def test_prepacked_layers_compute_nn_linear_for_any_leading_shape(bias):
    model = two_layers(bias)
    x = torch.randn(16, 64)
    with torch.no_grad():
        expected = model(x)
        assert hf_dspark.prepack_linears(model) == 2
        got = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(16)])
        in_threes = model(x[:3].reshape(1, 3, 64)).reshape(3, 48)  # any leading shape
    assert all(type(m) is PrepackedLinear for m in model if isinstance(m, nn.Linear))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # bitwise equal on the 2-core AVX2 CPU measured (scripts/prepacked_linear_speed.py prints it); oneDNN may split
    # the reduction differently by row count on other CPUs, so only closeness is required here
    torch.testing.assert_close(alone, got, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(in_threes, got[:3], rtol=1e-5, atol=1e-5)


def test_prepacked_layers_copy_and_serve_long_inputs_unpacked():
    model, reference = two_layers(), two_layers()
    hf_dspark.prepack_linears(model)
    clone = copy.deepcopy(model)  # the opaque packed copy is left out and rebuilt on first use
    long = torch.randn(MAX_PACKED_ROWS + 1, 64)  # a long prefill: torch's default kernels
    with torch.no_grad():
        x = torch.randn(4, 64)
        torch.testing.assert_close(clone(x), reference(x), rtol=1e-5, atol=1e-5)
        assert torch.equal(model(long), reference(long))


def test_prepacked_layer_follows_weight_changes():
    model = two_layers()
    hf_dspark.prepack_linears(model)
    x = torch.randn(4, 64)
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # in place
        model[2].load_state_dict({"weight": torch.randn(48, 96), "bias": torch.zeros(48)})
        got = model(x)
    reference = two_layers()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(got, reference(x), rtol=1e-5, atol=1e-5)


def test_prepacked_layers_train_and_fall_back_outside_fp32_cpu():
    model, reference = two_layers(), two_layers()
    hf_dspark.prepack_linears(model)
    x = torch.randn(8, 64)
    model(x).square().sum().backward()  # autograd: nn.Linear's own forward
    reference(x).square().sum().backward()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    model.to(torch.bfloat16)
    with torch.no_grad():
        out = model(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16


def test_prepack_refuses_models_it_cannot_serve(monkeypatch):
    with pytest.raises(ValueError, match="fp32 or bf16 models on the CPU.*float16"):
        hf_dspark.prepack_linears(two_layers().to(torch.float16))
    with pytest.raises(ValueError, match="no parameters"):
        hf_dspark.prepack_linears(nn.Sequential())
    monkeypatch.setattr(prepack, "cpu_multiplies_bf16", lambda: False)  # torch emulates bf16 there: no packing
    with pytest.raises(ValueError, match="bf16 only on a CPU with avx512_bf16 or AMX.*bfloat16"):
        hf_dspark.prepack_linears(two_layers().to(torch.bfloat16))


@pytest.mark.skipif(not packs_bf16(), reason="bf16 is packed only on a CPU with avx512_bf16 or AMX")
def test_bf16_prepacked_layers_compute_nn_linear_and_stay_in_their_dtype():
    model, reference = two_layers().to(torch.bfloat16), two_layers().to(torch.bfloat16)
    x = torch.randn(8, 64).to(torch.bfloat16)
    assert hf_dspark.prepack_linears(model) == 2
    with torch.no_grad():
        got = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(8)])
        torch.testing.assert_close(got, reference(x))  # oneDNN rounds to bf16 once, as torch's own path
        torch.testing.assert_close(alone, got)
    assert got.dtype == torch.bfloat16 and model[0]._packed_dtype == torch.bfloat16


def test_unpack_restores_plain_layers_and_the_state_dict_never_changes():
    model = two_layers()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hf_dspark.prepack_linears(model)
    assert model.state_dict().keys() == before.keys()
    assert hf_dspark.unpack_linears(model) == 2 and not is_prepacked(model)
    assert all(type(m) is nn.Linear for m in model if isinstance(m, nn.Linear))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_generate_prepacks_the_drafter_of_a_prepacked_target_and_stays_exact():
    target = tiny_target()
    drafter = tiny_drafter(target)
    ids = torch.randint(3, target.config.vocab_size, (2, 9))
    kw = dict(max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(ids))
    unpacked = target.generate(ids, assistant_model=drafter, **kw)
    hf_dspark.prepack_linears(target)
    assert not is_prepacked(drafter)
    plain = target.generate(ids, **kw)
    spec = target.generate(ids, assistant_model=drafter, **kw)
    assert is_prepacked(drafter)
    assert torch.equal(spec, plain)
    assert torch.equal(spec, unpacked)


def test_step_tables_name_the_linear_kernels_they_were_measured_with():
    target = tiny_target()
    assert linear_kernels(target) == "default"
    old = {"sample_batch_tokens": [1, 8], "sample_steps_per_sec": [20.0, 15.0], "max_batch_tokens": 8}
    StepTimeTable.from_dict(old, linear_kernels="default")  # tables from before the field: torch's kernels
    hf_dspark.prepack_linears(target)
    assert linear_kernels(target) == "onednn-prepacked"
    with pytest.raises(InvalidStepTableError, match="'default' linear layers, not 'onednn-prepacked'"):
        StepTimeTable.from_dict(old, linear_kernels=linear_kernels(target))


@pytest.mark.real
def test_real_targets_load_prepacked_in_fp32_and_in_bf16_where_the_cpu_multiplies_it(smollm2):
    from hf_dspark.targets import load_target

    model, _ = smollm2  # so the real-model exactness tests run the prepacked path
    assert is_prepacked(model)
    # tied embeddings stay tied: the packed copy sits beside the weight
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    bf16, _ = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
    assert is_prepacked(bf16) == packs_bf16()


def test_an_unpacked_fp32_cpu_target_gets_a_hint(caplog):
    import logging

    logging.Logger.warning_once.cache_clear()  # transformers' once-only warnings are cached per process
    target = tiny_target()
    drafter = tiny_drafter(target)
    ids = torch.randint(3, target.config.vocab_size, (1, 6))
    with caplog.at_level(logging.WARNING):
        target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, max_new_tokens=4)
    assert "hf_dspark.prepack_linears(model)" in caplog.text
    assert not is_prepacked(target)  # a hint, never a change to the user's model
