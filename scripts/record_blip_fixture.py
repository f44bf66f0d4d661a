"""Record tests/fixtures/blip_original/: a tiny, randomly initialised ORIGINAL BLIP (salesforce/BLIP model code), its
checkpoint in the pre-training layout and its outputs on a fixed input, for tests/test_convert_blip.py.

The original model code comes from the PyPI package ``blip-ci`` (a packaging of the salesforce/BLIP ``models/``
folder). It pins old libraries (timm 0.4.12, fairscale 0.4.4, and its ``med.py`` needs a transformers 4.x), so it
must NOT be installed into the project's environment. Run this script in a throwaway environment instead::

    python3.11 -m venv /tmp/blipenv
    /tmp/blipenv/bin/pip install transformers==4.30.2 "numpy<2"
    /tmp/blipenv/bin/pip install --no-deps timm==0.4.12 fairscale==0.4.4 blip-ci==0.0.5
    # torch (and torchvision, which timm imports): either install a CPU build into /tmp/blipenv, or borrow the
    # project's copy read-only by appending its site-packages to the throwaway environment's path:
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/blipenv/lib/python3.11/site-packages/zz_project.pth
    /tmp/blipenv/bin/python scripts/record_blip_fixture.py            # writes tests/fixtures/blip_original/

(The ``.pth`` line comes after the throwaway environment's own packages on ``sys.path``, so its transformers 4.30
wins over the project's.) The fixture was recorded this way with torch 2.14 (CPU), transformers 4.30.2, timm 0.4.12.

What is recorded (all tiny: ViT and BERT widths of 24, two layers, 32-pixel images):

* ``model_tiny_pretrain.pth`` -- ``{"model": state_dict}`` in the layout of BLIP's pre-training checkpoints
  (``model_base.pth``): ``visual_encoder``, ``text_encoder``, ``vision_proj``, ``text_proj``, ``itm_head``,
  ``text_decoder``, the momentum copies (``*_m``), the queues and ``temp``. The image-text parts are those of an
  original ``BLIP_ITM``, the decoder that of an original ``BLIP_Decoder`` sharing the same vision transformer.
* ``hf_base/`` -- a transformers BLIP folder with the tiny config and a processor (tokenizer with BLIP's ``[DEC]``
  and ``[ENC]`` tokens); the converter's ``--base``. Its resolution (64) differs from the checkpoint's (32), as
  the hub folders' 384 differs from the pre-training checkpoints' 224.
* ``expected.pt`` -- the fixed input (two images, two captions, the token ids BLIP's own tokenisation made) and the
  original model's outputs: vision embeddings, ITC features and similarities, ITM logits (as ``BLIP_ITM`` computes
  them, and with ``[ENC]`` as first token as ``BLIP_Retrieval`` does), caption logits, the decoder's loss (label
  smoothing 0.1, prompt tokens masked), greedy captions, and the ITC/ITM outputs of an original ``BLIP_ITM`` at
  48 pixels loaded from the 32-pixel checkpoint by BLIP's own ``load_checkpoint`` (position embeddings interpolated).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "blip_original"
WORDS = ["a", "picture", "of", "dog", "cat", "man", "woman", "sitting", "on", "the", "beach", "with", "her", "red",
         "car", "grass", "two", "in", "standing", "."]
WIDTH, LAYERS, HEADS, PATCH, IMAGE, EMBED = 24, 2, 2, 8, 32, 16
#: the base folder's resolution differs from the checkpoint's, as the hub ports' 384 differs from pre-training's 224
BASE_IMAGE = 64
PROMPT = "a picture of "
CAPTIONS = ["a dog sitting on the beach", "a woman with her red car"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(OUT), help="fixture folder to (re)write")
    args = parser.parse_args()

    import blip.models.blip as blip_mod
    import blip.models.blip_itm as blip_itm_mod
    import torch
    import torch.nn.functional as F
    import transformers
    from blip.models.vit import VisionTransformer
    from transformers import (
        BertTokenizer,
        BlipConfig,
        BlipImageProcessor,
        BlipProcessor,
    )

    if not transformers.__version__.startswith("4."):
        sys.exit(f"run this in the throwaway environment (transformers 4.x), not with transformers "
                 f"{transformers.__version__}; see the module docstring")
    out = Path(args.out)
    work = Path(tempfile.mkdtemp())
    vocab = work / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")

    def tiny_tokenizer():
        # BLIP's init_tokenizer, on a tiny vocabulary instead of bert-base-uncased
        tok = BertTokenizer(str(vocab))
        tok.add_special_tokens({"bos_token": "[DEC]"})
        tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
        tok.enc_token_id = tok.additional_special_tokens_ids[0]
        return tok

    def tiny_vit(vit, image_size, use_grad_checkpointing=False, ckpt_layer=0, drop_path_rate=0):
        # BLIP's create_vit with a tiny width and depth (the original VisionTransformer class)
        return VisionTransformer(img_size=image_size, patch_size=PATCH, embed_dim=WIDTH, depth=LAYERS,
                                 num_heads=HEADS, mlp_ratio=2.0), WIDTH

    for module in (blip_mod, blip_itm_mod):
        module.create_vit = tiny_vit
        module.init_tokenizer = tiny_tokenizer
    tokenizer = tiny_tokenizer()
    med = work / "med_config.json"
    med.write_text(json.dumps({
        "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "hidden_size": WIDTH, "initializer_range": 0.02, "intermediate_size": 2 * WIDTH,
        "layer_norm_eps": 1e-12, "max_position_embeddings": 40, "model_type": "bert", "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS, "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": len(tokenizer),
        "encoder_width": WIDTH, "add_cross_attention": True}))

    torch.manual_seed(0)
    itm = blip_itm_mod.BLIP_ITM(med_config=str(med), image_size=IMAGE, embed_dim=EMBED).eval()
    dec = blip_mod.BLIP_Decoder(med_config=str(med), image_size=IMAGE, prompt=PROMPT).eval()
    with torch.no_grad():
        # "randomly initialised": move every weight off its initial constant (zero biases, unit norms) so that a
        # swapped or dropped tensor changes the outputs
        for model in (itm, dec):
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        dec.visual_encoder.load_state_dict(itm.visual_encoder.state_dict())

    # the pre-training layout (BLIP_Pretrain's attribute names), as model_base.pth stores it
    state = {}
    for name, module in (("visual_encoder", itm.visual_encoder), ("text_encoder", itm.text_encoder),
                         ("vision_proj", itm.vision_proj), ("text_proj", itm.text_proj), ("itm_head", itm.itm_head),
                         ("text_decoder", dec.text_decoder)):
        state.update({f"{name}.{k}": v.clone() for k, v in module.state_dict().items()})
    for name in ("visual_encoder", "text_encoder", "vision_proj", "text_proj"):
        state.update({f"{name}_m.{k[len(name) + 1:]}": v.clone() for k, v in list(state.items())
                      if k.startswith(name + ".")})
    state["image_queue"] = F.normalize(torch.randn(EMBED, 8), dim=0)
    state["text_queue"] = F.normalize(torch.randn(EMBED, 8), dim=0)
    state["queue_ptr"] = torch.zeros(1, dtype=torch.long)
    state["temp"] = torch.tensor(0.07)

    torch.manual_seed(1)
    image = torch.randn(2, 3, IMAGE, IMAGE)
    image48 = torch.randn(2, 3, 48, 48)
    expected = {"image": image, "image48": image48, "captions": CAPTIONS, "prompt": PROMPT}
    with torch.no_grad():
        # image-text matching model: BLIP_ITM's own forward (it tokenises with max_length 35)
        text = itm.tokenizer(CAPTIONS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
        expected["itm_input_ids"], expected["itm_attention_mask"] = text.input_ids, text.attention_mask
        image_embeds = itm.visual_encoder(image)
        expected["image_embeds"] = image_embeds
        text_out = itm.text_encoder(text.input_ids, attention_mask=text.attention_mask, return_dict=True, mode="text")
        expected["text_embeds"] = text_out.last_hidden_state
        expected["image_feat"] = F.normalize(itm.vision_proj(image_embeds[:, 0, :]), dim=-1)
        expected["text_feat"] = F.normalize(itm.text_proj(text_out.last_hidden_state[:, 0, :]), dim=-1)
        expected["itc_sim"] = itm(image, CAPTIONS, match_head="itc")
        expected["itm_logits"] = itm(image, CAPTIONS, match_head="itm")
        enc_ids = text.input_ids.clone()
        enc_ids[:, 0] = tokenizer.enc_token_id          # BLIP_Retrieval / pre-training: [ENC] replaces [CLS]
        expected["itm_enc_input_ids"] = enc_ids
        atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long)
        expected["itm_enc_logits"] = itm.itm_head(itm.text_encoder(
            enc_ids, attention_mask=text.attention_mask, encoder_hidden_states=image_embeds,
            encoder_attention_mask=atts, return_dict=True).last_hidden_state[:, 0, :])

        # captioning model: BLIP_Decoder.forward's tokenisation and targets, keeping the logits as well
        cap = dec.tokenizer([PROMPT + c for c in CAPTIONS], padding="longest", truncation=True, max_length=40,
                            return_tensors="pt")
        ids = cap.input_ids.clone()
        ids[:, 0] = dec.tokenizer.bos_token_id
        targets = ids.masked_fill(ids == dec.tokenizer.pad_token_id, -100)
        targets[:, :dec.prompt_length] = -100
        out_dec = dec.text_decoder(ids, attention_mask=cap.attention_mask, encoder_hidden_states=image_embeds,
                                   encoder_attention_mask=atts, labels=targets, return_dict=True)
        expected.update(caption_input_ids=ids, caption_attention_mask=cap.attention_mask, caption_labels=targets,
                        caption_logits=out_dec.logits, caption_loss=dec(image, [PROMPT + c for c in CAPTIONS]))
        assert torch.allclose(expected["caption_loss"], out_dec.loss)
        # greedy: with beams, BLIP's generate repeats the image embeddings itself and transformers 4.30 repeats them
        # again (BLIP was written for an older transformers), so beam search fails in this environment
        expected["greedy_captions"] = dec.generate(image, sample=False, num_beams=1, max_length=12, min_length=5)
        expected["prompt_ids"] = dec.tokenizer([PROMPT], return_tensors="pt").input_ids

    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "model_tiny_pretrain.pth"
    torch.save({"model": state}, ckpt)

    with torch.no_grad():
        # the same checkpoint at 48 pixels through BLIP's own loader (bicubic position-embedding interpolation)
        itm48 = blip_itm_mod.BLIP_ITM(med_config=str(med), image_size=48, embed_dim=EMBED).eval()
        itm48, msg = blip_mod.load_checkpoint(itm48, str(ckpt))
        assert not msg.missing_keys, msg.missing_keys
        expected["itc_sim_48"] = itm48(image48, CAPTIONS, match_head="itc")
        expected["itm_logits_48"] = itm48(image48, CAPTIONS, match_head="itm")
    torch.save(expected, out / "expected.pt")

    base = out / "hf_base"
    shutil.rmtree(base, ignore_errors=True)
    config = BlipConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": WIDTH, "encoder_hidden_size": WIDTH,
                     "intermediate_size": 2 * WIDTH, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                     "max_position_embeddings": 40, "bos_token_id": tokenizer.bos_token_id,
                     "eos_token_id": tokenizer.sep_token_id, "sep_token_id": tokenizer.sep_token_id,
                     "pad_token_id": tokenizer.pad_token_id},
        vision_config={"hidden_size": WIDTH, "intermediate_size": 2 * WIDTH, "num_hidden_layers": LAYERS,
                       "num_attention_heads": HEADS, "image_size": BASE_IMAGE, "patch_size": PATCH},
        image_text_hidden_size=EMBED)
    config.save_pretrained(base)
    processor = BlipProcessor(BlipImageProcessor(size={"height": BASE_IMAGE, "width": BASE_IMAGE}), tokenizer)
    processor.save_pretrained(base)
    shutil.rmtree(work, ignore_errors=True)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({size / 1024:.0f} KiB); greedy captions: {expected['greedy_captions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
