"""research/deepen.py: block expansion keeps the policy's outputs, for the VL and the text models, its folder loads as
`model.source=pretrained`, and the new blocks learn."""

import pytest
import torch
from test_trainer import repo_module

from vagen.models.registry import load_policy


def deepen_module():
    return repo_module("research/deepen.py")


def test_expanded_order_puts_a_zeroed_copy_after_every_n_layers():
    order = deepen_module().expanded_order
    assert order(3, 1) == [(0, False), (0, True), (1, False), (1, True), (2, False), (2, True)]
    assert order(4, 2) == [(0, False), (1, False), (1, True), (2, False), (3, False), (3, True)]
    for every in (0, 5):
        with pytest.raises(ValueError, match="every="):
            order(4, every)


@pytest.mark.parametrize("name, modality", [("tiny_vl_test", "vision"), ("tiny_text_test", "text")])
def test_the_deeper_model_computes_the_same_logits_and_its_new_blocks_learn(name, modality):
    deepen = deepen_module()
    source = "tiny_vl_random" if modality == "vision" else "tiny_text"
    policy = load_policy(name, source, modality, size="test", dtype="float32")
    deeper = deepen.deepen(policy.model, every=1)
    layers = len(deepen.decoder_layers(policy.model))
    assert len(deepen.decoder_layers(deeper)) == 2 * layers
    vocab = policy.model.config.get_text_config().vocab_size
    ids = torch.randint(10, vocab, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(deeper(input_ids=ids).logits, policy.model(input_ids=ids).logits, rtol=0, atol=1e-6)
    deeper.train()
    deeper(input_ids=ids, labels=ids).loss.backward()
    copy = deepen.decoder_layers(deeper)[1]  # the zeroed copy of layer 0
    assert not copy.self_attn.o_proj.weight.any() and copy.self_attn.o_proj.weight.grad.abs().sum() > 0
    assert copy.mlp.down_proj.weight.grad.abs().sum() > 0


def test_the_script_writes_a_folder_that_loads_as_a_pretrained_model(tmp_path, capsys):
    deepen = deepen_module()
    deepen.main(["model=tiny_vl_test", f"out={tmp_path}", "every=2"])
    assert "2 -> 3 layers" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="every=3 must be between 1 and the model's 2 layers"):
        deepen.main(["model=tiny_vl_test", f"out={tmp_path / 'other'}", "every=3"])
    policy = load_policy("deep", "pretrained", "vision", path=str(tmp_path), dtype="float32")
    original = load_policy("tiny_vl_test", "tiny_vl_random", "vision", size="test", dtype="float32")
    assert len(deepen.decoder_layers(policy.model)) == 3
    ids = torch.arange(10, 30).unsqueeze(0)
    with torch.no_grad():
        expected = original.model(input_ids=ids).logits
        torch.testing.assert_close(policy.model(input_ids=ids).logits, expected, rtol=0, atol=1e-6)
