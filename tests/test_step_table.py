"""StepTimeTable: JSON, lookup, validation, profiling, and the local / drafter-repo / Hub-cache resolution."""

import json
import os
import re
from pathlib import Path

import huggingface_hub
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_dspark import step_table
from hf_dspark.attention import SDPA_FORCE_GQA
from hf_dspark.step_table import (
    InvalidStepTableError,
    StepTimeTable,
    device_slug,
    load_or_profile,
    profile,
    upload_step_table,
)

TARGET = "org/tiny-llama"
PROBES = dict(batch_tokens=[1, 512], context_len=8, repeats=1, warmup=1, progress=False)


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def count_profiles(monkeypatch):
    calls = []
    real = step_table.profile

    def counting(model, **kwargs):
        calls.append(kwargs)
        return real(model, **kwargs)

    monkeypatch.setattr(step_table, "profile", counting)
    return calls


def table_for_this_machine(**meta) -> StepTimeTable:
    metadata = {"device_slug": device_slug("cpu"), "dtype": "float32", "target_id": TARGET, "grouped_kv_heads": True}
    metadata |= meta
    return StepTimeTable([1, 8, 64], [100.0, 90.0, 40.0], max_batch_tokens=64, metadata=metadata)


def table_path(root) -> str:
    return f"{root}/{step_table.target_slug(TARGET)}/{device_slug('cpu')}.json"


# -- format and lookup -------------------------------------------------------------------------------------------


def test_json_round_trip_is_sglang_compatible_and_atomic(tmp_path):
    table = table_for_this_machine(context_length=256)
    path = table.save(tmp_path / "sub" / "t.json")
    data = json.loads(path.read_text())
    assert data["sample_batch_tokens"] == [1, 8, 64] and data["max_batch_tokens"] == 64
    assert data["sample_steps_per_sec"] == [100.0, 90.0, 40.0]
    assert StepTimeTable.load(path) == table
    assert StepTimeTable.from_dict(json.loads(table.to_json())) == table
    assert [p.name for p in path.parent.iterdir()] == ["t.json"]  # no temporary file left behind


def test_floor_lookup_at_below_and_above_probes():
    table = StepTimeTable([4, 8, 16], [50.0, 40.0, 20.0], max_batch_tokens=32)
    cases = {1: 50.0, 4: 50.0, 7: 50.0, 8: 40.0, 15: 40.0, 16: 20.0, 100: 20.0}
    for n, sps in cases.items():
        assert table.steps_per_sec(n) == sps
    n = torch.arange(0, 40)
    assert table.steps_per_sec_tensor(n).tolist() == [table.steps_per_sec(int(i)) for i in n]
    for start, stop in [(6, 10), (0, 33), (15, 20), (20, 33), (5, 5)]:
        assert table.steps_per_sec_range(start, stop).tolist() == [table.steps_per_sec(i) for i in range(start, stop)]



def test_interpolated_seconds_are_linear_between_probes_and_flat_outside():
    table = StepTimeTable([4, 8, 16], [50.0, 40.0, 20.0], max_batch_tokens=32)
    got = table.seconds_interpolated(torch.tensor([1, 4, 6, 8, 12, 16, 30]))
    assert got.tolist() == pytest.approx([0.02, 0.02, 0.0225, 0.025, 0.0375, 0.05, 0.05])


@pytest.mark.parametrize(
    "data, message",
    [
        ({"sample_batch_tokens": [], "sample_steps_per_sec": [], "max_batch_tokens": 8}, "empty"),
        ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [3.0], "max_batch_tokens": 8}, "2 probes"),
        ({"sample_batch_tokens": [4, 2], "sample_steps_per_sec": [3.0, 1.0], "max_batch_tokens": 8}, "increasing"),
        ({"sample_batch_tokens": [1, 2.5], "sample_steps_per_sec": [3.0, 1.0], "max_batch_tokens": 8}, "integers"),
        ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [3.0, -1.0], "max_batch_tokens": 8}, "positive"),
        ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [3.0, float("nan")], "max_batch_tokens": 8}, "finite"),
        ({"sample_batch_tokens": [1, 2, 4], "sample_steps_per_sec": [30.0, 29.9, 30.1], "max_batch_tokens": 8}, "flat"),
        ({"sample_batch_tokens": [1], "sample_steps_per_sec": [30.0], "max_batch_tokens": 8}, "flat"),
        ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [3.0, 1.0], "max_batch_tokens": 0}, "max_batch"),
        ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [3.0, 1.0]}, "lacks max_batch_tokens"),
        ([1, 2, 3], "JSON object"),
        (
            {
                "sample_batch_tokens": [1, 2],
                "sample_steps_per_sec": [3.0, 1.0],
                "max_batch_tokens": 8,
                "metadata": {"curves": {"4": {"sample_batch_tokens": [4, 8], "sample_steps_per_sec": [2.0, 2.0]}}},
            },
            "curve for 4 requests is invalid: .*flat",
        ),
    ],
)
def test_invalid_tables_are_refused_with_the_reason(data, message):
    with pytest.raises(InvalidStepTableError, match=message):
        StepTimeTable.from_dict(data)


def test_metadata_must_match_expected_device_dtype_and_target():
    data = table_for_this_machine().to_dict()
    StepTimeTable.from_dict(data, device_slug=device_slug("cpu"), dtype="float32", target_id=TARGET)
    for expected, message in [
        ({"device_slug": "cuda-nvidia-h200"}, "device"),
        ({"dtype": "bfloat16"}, "dtype"),
        ({"target_id": "org/other"}, "target"),
    ]:
        with pytest.raises(InvalidStepTableError, match=message):
            StepTimeTable.from_dict(data, **expected)


def test_truncated_file_is_an_invalid_table(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(table_for_this_machine().to_json()[:40])
    with pytest.raises(InvalidStepTableError, match="not valid JSON"):
        StepTimeTable.load(path)


def test_device_slugs(monkeypatch):
    assert re.fullmatch(r"cpu-[a-z0-9-]+-\d+t", device_slug("cpu"))
    assert device_slug("cpu").endswith(f"-{torch.get_num_threads()}t")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert device_slug("cuda:0") == "cuda-nvidia-h200"


# -- profiling ---------------------------------------------------------------------------------------------------


def test_profile_keeps_context_fixed_and_pads_rows(tiny_model):
    seen = []  # (cache length before the forward, per-row attended new tokens)
    grouped = []  # probes of several tokens run as the loop's verify forwards (hf_dspark.attention)

    def record(module, args, kwargs):
        if kwargs.get("position_ids") is not None:
            cache, mask = kwargs["cache"], kwargs["attention_mask"]
            seen.append((cache.get_seq_length(), (mask[:, 8:].sum(1)).tolist()))
            grouped.append(os.environ.get(SDPA_FORCE_GQA) == "1" or kwargs["input_ids"].shape[1] == 1)

    handle = tiny_model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        table = profile(tiny_model, **(PROBES | dict(batch_tokens=[1, 3, 512], num_requests=(1, 2))), target_id=TARGET)
    finally:
        handle.remove()
    assert {length for length, _ in seen} == {8}
    assert {tuple(rows) for _, rows in seen} == {(1,), (3,), (512,), (2, 1), (256, 256)}
    assert table.sample_batch_tokens == [1, 3, 512] and table.max_batch_tokens == 512
    meta = table.metadata
    assert meta["device_slug"] == device_slug("cpu") and meta["dtype"] == "float32" and meta["target_id"] == TARGET
    assert meta["context_length"] == 8 and meta["num_requests"] == [1, 2] and meta["repeats"] == 1
    assert all(grouped) and meta["grouped_kv_heads"] is True and SDPA_FORCE_GQA not in os.environ
    assert table.for_num_requests(2).sample_batch_tokens == [3, 512]


# -- load_or_profile ---------------------------------------------------------------------------------------------


def test_profiles_once_then_reads_the_local_cache(tiny_model, tmp_path, count_profiles):
    first = load_or_profile(tiny_model, drafter_repo=None, target_id=TARGET, cache_dir=tmp_path, profile_kwargs=PROBES)
    assert len(count_profiles) == 1
    assert StepTimeTable.load(table_path(tmp_path)) == first
    again = load_or_profile(tiny_model, drafter_repo=None, target_id=TARGET, cache_dir=tmp_path, profile_kwargs=PROBES)
    assert again == first and len(count_profiles) == 1


@pytest.mark.parametrize(
    "content, why",
    [
        (lambda: table_for_this_machine().to_json()[:50], "not valid JSON"),
        (lambda: json.dumps(table_for_this_machine().to_dict() | {"sample_steps_per_sec": [50.0, 50.0, 50.0]}), "flat"),
        (lambda: table_for_this_machine(dtype="bfloat16").to_json(), "dtype"),
        (lambda: table_for_this_machine(device_slug="cuda-nvidia-h200").to_json(), "device"),
        (lambda: table_for_this_machine(target_id="org/other").to_json(), "target"),
        (lambda: table_for_this_machine(grouped_kv_heads=False).to_json(), "repeated key/value heads"),
        (lambda: b"\xff\xfe binary garbage", "not valid JSON"),
    ],
)
def test_bad_cached_table_warns_and_reprofiles(tiny_model, tmp_path, count_profiles, caplog, content, why):
    path = table_path(tmp_path)
    data = content()
    Path(path).parent.mkdir(parents=True)
    Path(path).write_bytes(data if isinstance(data, bytes) else data.encode())
    table = load_or_profile(tiny_model, drafter_repo=None, target_id=TARGET, cache_dir=tmp_path, profile_kwargs=PROBES)
    assert len(count_profiles) == 1
    assert path in caplog.text and why in caplog.text
    assert StepTimeTable.load(path) == table  # the bad file was replaced


def test_reads_the_table_from_a_local_drafter_folder(tiny_model, tmp_path, count_profiles):
    shipped = table_for_this_machine()
    shipped.save(table_path(tmp_path / "drafter" / "step_tables"))
    drafter = str(tmp_path / "drafter")
    got = load_or_profile(tiny_model, drafter_repo=drafter, target_id=TARGET, cache_dir=tmp_path / "c")
    assert got == shipped and not count_profiles
    assert StepTimeTable.load(table_path(tmp_path / "c")) == shipped  # copied to the local cache


def fake_hub_cache(root, repo_id: str, files: dict) -> None:
    """The huggingface_hub cache layout: models--org--name/{refs/main, snapshots/<sha>/<files>}."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    for name, text in files.items():
        path = repo / "snapshots" / sha / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    return hub


def test_reads_the_table_from_the_offline_hub_cache(tiny_model, tmp_path, offline_hub, count_profiles):
    shipped = table_for_this_machine()
    name = table_path("step_tables")
    fake_hub_cache(offline_hub, "org/drafter", {name: shipped.to_json()})
    got = load_or_profile(tiny_model, drafter_repo="org/drafter", target_id=TARGET, cache_dir=tmp_path / "c")
    assert got == shipped and not count_profiles


def test_offline_hub_miss_or_bad_table_profiles(tiny_model, tmp_path, offline_hub, count_profiles, caplog):
    fake_hub_cache(offline_hub, "org/drafter", {table_path("step_tables"): "{"})
    for repo in ("org/not-cached", "org/drafter"):
        cache_dir = tmp_path / repo
        load_or_profile(tiny_model, drafter_repo=repo, target_id=TARGET, cache_dir=cache_dir, profile_kwargs=PROBES)
    assert len(count_profiles) == 2
    assert "not valid JSON" in caplog.text


def test_upload_puts_the_table_under_target_and_device(monkeypatch):
    uploads = []

    class FakeApi:
        def __init__(self, token=None):
            self.token = token

        def upload_file(self, **kwargs):
            uploads.append(kwargs | {"token": self.token})
            return "commit"

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    table = table_for_this_machine()
    assert upload_step_table(table, "org/drafter", TARGET, token="t") == "commit"
    (call,) = uploads
    assert call["repo_id"] == "org/drafter" and call["token"] == "t"
    assert call["path_in_repo"] == table_path("step_tables")
    assert StepTimeTable.from_dict(json.loads(call["path_or_fileobj"])) == table
    with pytest.raises(InvalidStepTableError, match="target"):
        upload_step_table(table, "org/drafter", "org/other")
    with pytest.raises(InvalidStepTableError, match="device_slug"):
        upload_step_table(StepTimeTable([1, 2], [2.0, 1.0], 2), "org/drafter", TARGET)
