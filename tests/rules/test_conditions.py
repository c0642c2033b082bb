from __future__ import annotations

import pytest

from gpufix import conditions


@pytest.mark.parametrize(
    ("text", "value"),
    [("1.65 GiB", 1.65 * 2**30), ("0 bytes", 0.0), ("512.00 MiB", 512 * 2**20), ("900000", 900000.0),
     ("30s", 30.0), ("6,184,517,632 bytes", 6184517632.0), ("2 GB", 2e9)],
)
def test_quantity_reads_sizes_numbers_and_durations(text: str, value: float) -> None:
    assert conditions.quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["cuda:0", "abc", "1.2.3", "12 parsecs", ""])
def test_quantity_rejects_non_quantities(text: str) -> None:
    assert conditions.quantity(text) is None


def test_holds_compares_sizes_across_units() -> None:
    fields = {"reserved_unallocated": "1.86 GiB", "device": "cpu"}
    assert conditions.holds("reserved_unallocated >= 1 GiB", fields)
    assert not conditions.holds("reserved_unallocated >= 2048 MiB", fields)
    assert conditions.holds("device == cpu", fields)
    assert conditions.holds("device != 'cuda:0'", fields)
    assert conditions.holds("device is set", fields)
    assert conditions.holds("other is missing", fields)
    assert not conditions.holds("other > 0", fields)  # a missing field never satisfies a comparison


def test_parse_condition_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="cannot read condition"):
        conditions.parse_condition("size is big")


def test_evaluate_subtracts_sizes_and_keeps_units() -> None:
    assert conditions.evaluate("reserved - allocated", {"reserved": "5.28 GiB", "allocated": "4.22 GiB"}) == "1.06 GiB"
    assert conditions.evaluate("a + b", {"a": "3", "b": "4"}) == "7"
    assert conditions.evaluate("reserved - allocated", {"reserved": "5.28 GiB"}) is None


def test_fill_needs_every_placeholder_and_keeps_escaped_braces() -> None:
    assert conditions.fill("GPU {gpu}: {free} free", {"gpu": "0", "free": "1 GiB"}) == "GPU 0: 1 GiB free"
    assert conditions.fill("GPU {gpu}: {free} free", {"gpu": "0"}) is None
    assert conditions.fill("{{k: v}} {x}", {"x": "1"}) == "{k: v} 1"


def test_escaped_braces_are_not_placeholders() -> None:
    assert conditions.placeholders('f"cuda:{{local_rank}}" on {gpu}') == ["gpu"]


def test_evaluate_multiplies_and_divides() -> None:
    assert conditions.evaluate("left / rate", {"left": "30000", "rate": "12.5"}) == "2400"
    assert conditions.evaluate("a * b", {"a": "2.5", "b": "4"}) == "10"
    assert conditions.evaluate("a / b", {"a": "1", "b": "0"}) is None
    assert conditions.evaluate("a / b", {"a": "1", "b": "3"}) == "0.333"


def test_contains_and_does_not_contain() -> None:
    fields = {"conf": "max_split_size_mb:128,expandable_segments:True"}
    assert conditions.holds("conf ~ expandable_segments:true", fields)
    assert not conditions.holds("conf !~ expandable_segments:true", fields)
    assert conditions.holds("other !~ expandable_segments:true", fields)  # unknown: does not contain it
    assert not conditions.holds("other ~ x", fields)


def test_not_negates_a_guard_a_missing_field_included() -> None:
    """`not job_cpu < 50`: measured at 50 or more, or not measured at all (DAT010's CPU-bound advice)."""
    assert conditions.holds("not job_cpu < 50", {"job_cpu": "71"})
    assert not conditions.holds("not job_cpu < 50", {"job_cpu": "5"})
    assert conditions.holds("not job_cpu < 50", {})
    assert conditions.parse_condition("not job_cpu < 50") == ("job_cpu", "<", "50")


KEYS = '"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight", "fc.weight"'


def _prefixed(prefix: str) -> str:
    return KEYS.replace('"', '"' + prefix, 1).replace(', "', ', "' + prefix)


def test_key_lists_that_differ_by_a_wrapper_prefix_pair_up() -> None:
    from gpufix.conditions import keys_unpaired, prefix_side, renaming, single_side, wrapper_prefix

    assert renaming(KEYS, _prefixed("module.")) == ("", "module.")  # a DataParallel checkpoint
    assert renaming(_prefixed("_orig_mod."), KEYS) == ("_orig_mod.", "")  # a compiled model
    assert renaming(_prefixed("model."), _prefixed("module.")) == ("model.", "module.")  # swapped
    assert wrapper_prefix(KEYS, _prefixed("module.")) == "module." and prefix_side(KEYS, _prefixed("module.")) == "checkpoint"
    assert prefix_side(_prefixed("model."), _prefixed("module.")) == "both"
    # the side a message can name ("the checkpoint names every key..."): none for a swapped prefix
    assert single_side(KEYS, _prefixed("module.")) == "checkpoint" and single_side(_prefixed("_orig_mod."), KEYS) == "model"
    assert single_side(_prefixed("model."), _prefixed("module.")) is None
    assert keys_unpaired(KEYS, _prefixed("module.")) is None
    # bare, comma-separated (mmcv) and Python-list ('...') forms are read too
    assert renaming("conv1.weight, bn1.weight, bn1.bias", "backbone.conv1.weight, backbone.bn1.weight") == ("", "backbone.")
    assert renaming("['0.conv1.weight', '0.bn1.weight']", "['conv1.weight', 'bn1.weight']") == ("0.", "")


def test_other_layers_do_not_pair_up() -> None:
    from gpufix.conditions import keys_unpaired, renaming

    # only the parameter name in common (weight/bias): another head, not another wrapper
    assert renaming('"fc.weight", "fc.bias", "fc2.weight"', '"classifier.weight", "classifier.bias", "head.weight"') is None
    assert keys_unpaired('"fc.weight", "fc.bias", "fc2.weight"', '"classifier.weight", "classifier.bias", "head.weight"') == "yes"
    # other blocks of the same model (layer4.0 against layer4.1) are not a renaming
    assert renaming('"layer4.0.conv1.weight", "layer4.0.bn1.bias"', '"layer4.1.conv1.weight", "layer4.1.bn1.bias"') is None
    # a layer that gained a sub-module (torch_geometric's GCNConv: conv1.weight -> conv1.lin.weight) pairs under no
    # prefix, even with two keys a side (a wrapper's prefix would pair every key)
    assert keys_unpaired('"conv1.lin.weight", "conv2.lin.weight"', '"conv1.weight", "conv2.weight"') == "yes"
    assert keys_unpaired('"conv1.weight", "conv2.weight"', '"module.conv1.weight", "module.conv2.weight"') is None
    # too few keys to say: no verdict either way
    assert keys_unpaired('"fc.weight"', '"classifier.weight"') is None


def test_lists_that_pair_only_by_chance_are_unexplained() -> None:
    """Two layouts of one architecture (Meta's LLaMA names against Hugging Face's) share a key or two
    behind a prefix ("model.norm.weight" / "norm.weight"); no prefix explains most keys."""
    from gpufix.conditions import keys_unexplained, keys_unpaired

    hf = '"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight", "lm_head.weight"'
    meta = '"tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.feed_forward.w3.weight", "norm.weight", "output.weight"'
    assert keys_unpaired(hf, meta) is None  # one key pairs
    assert keys_unexplained(hf, meta) == "yes"
    assert keys_unexplained(KEYS, _prefixed("module.")) is None  # a wrapper's prefix explains them all
    assert keys_unexplained('"model.fc.weight", "model.fc.bias"', '"head.weight", "head.bias"') is None  # too few to judge


def test_derive_functions_and_their_validation() -> None:
    from gpufix import conditions

    fields = {"missing": KEYS, "unexpected": _prefixed("module.")}
    assert conditions.evaluate("wrapper_prefix(missing, unexpected)", fields) == "module."
    assert conditions.evaluate("wrapper_prefix(missing, absent)", fields) is None
    with pytest.raises(ValueError, match="unknown function 'nope'"):
        conditions.parse_expression("nope(missing, unexpected)")


def test_same_head_tells_a_prefix_from_a_layer_built_differently() -> None:
    from gpufix.conditions import evaluate

    assert evaluate("same_head(a, b)", {"a": "conv1.weight", "b": "conv1.bias"}) == "yes"
    assert evaluate("same_head(a, b)", {"a": "proj.0.weight", "b": "patch_embed.proj.weight"}) == "no"
    assert evaluate("same_head(a, b)", {"a": "conv1.weight"}) is None  # one side not printed: no verdict
