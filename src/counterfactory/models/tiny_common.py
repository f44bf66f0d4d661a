"""What the tiny builders share: the caption-like corpus their tokenizers are trained on, the byte-level BPE and
CLIP tokenizers built offline from it or from open_clip's bundled merges, and the seeding of a build.

:mod:`.tiny` (the text builders, the builder table, ``build``) and the image / evaluation builders beside it
(``tiny_eval``, ``tiny_vision``, ``tiny_llm``, ...) import this module; it imports none of them. The names are also
reachable as ``tiny.<name>``.
"""

from __future__ import annotations

import gzip
import json
import random
import tempfile
from pathlib import Path

# Words for the tokenizer-training corpus: the 80 MS-COCO category names plus common scene words.
COCO_CATEGORIES = (
    "person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant stop_sign "
    "parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe backpack umbrella handbag "
    "tie suitcase frisbee skis snowboard sports_ball kite baseball_bat baseball_glove skateboard surfboard "
    "tennis_racket bottle wine_glass cup fork knife spoon bowl banana apple sandwich orange broccoli carrot "
    "hot_dog pizza donut cake chair couch potted_plant bed dining_table toilet tv laptop mouse remote "
    "keyboard cell_phone microwave oven toaster sink refrigerator book clock vase scissors teddy_bear "
    "hair_drier toothbrush"
).split()
SCENE_NOUNS = (
    "man woman child boy girl people player street beach field kitchen table room road city park water "
    "grass snow sky building window door wall floor plate desk tree hill river ocean wave rocket "
    "astronaut coffee mug blanket flowers horse camera photo picture shirt hat jacket bag ball game"
).split()
ADJECTIVES = "small large red white black blue green young old wooden tall little empty busy".split()
VERBS = "sitting standing holding riding eating lying walking playing looking flying parked".split()
PREPOSITIONS = "on in near with next_to under behind beside at by".split()


def caption_corpus(n: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic caption-like sentences for training the tiny tokenizers."""
    rng = random.Random(seed)
    nouns = [w.replace("_", " ") for w in COCO_CATEGORIES] + SCENE_NOUNS
    plurals = [w + "s" for w in nouns if not w.endswith("s")]
    lines = []
    for _ in range(n):
        a, b = rng.choice(nouns + plurals), rng.choice(nouns + plurals)
        lines.append(
            f"{rng.choice(['A', 'The', 'Two', 'Some'])} {rng.choice(ADJECTIVES)} {a} "
            f"{rng.choice(VERBS)} {rng.choice(PREPOSITIONS).replace('_', ' ')} the {b}."
        )
    return lines


def _train_byte_bpe(corpus: list[str], vocab_size: int, special_tokens: list[str], out: Path) -> Path:
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(corpus, vocab_size=vocab_size, min_frequency=2, special_tokens=special_tokens)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_model(str(out))  # vocab.json + merges.txt
    return out


def _vocab_and_merges(folder: Path) -> dict:
    """Read ``vocab.json``/``merges.txt`` into the ``vocab=``/``merges=`` arguments of HF tokenizers."""
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split()) for line in lines if line and not line.startswith("#version")]
    return {"vocab": vocab, "merges": merges}


def _seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte -> printable-unicode map (as published with the CLIP BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_clip_tokenizer_files(out: Path) -> Path:
    """Write ``vocab.json`` + ``merges.txt`` of the exact CLIP tokenizer from open_clip's bundled BPE.

    The vocabulary is 256 byte symbols, their ``</w>`` forms, one entry per merge (48,894 merges),
    then ``<|startoftext|>`` and ``<|endoftext|>``: 49,408 tokens, as in openai/clip-vit-*.
    """
    import open_clip

    bpe_path = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    merges = gzip.open(bpe_path).read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    symbols = list(bytes_to_unicode().values())
    vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return out


def clip_tokenizer(max_length: int = 77):
    """An exact ``CLIPTokenizer`` (fast) built offline from the bundled BPE."""
    from transformers import CLIPTokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        write_clip_tokenizer_files(Path(tmp))
        tok = CLIPTokenizerFast(**_vocab_and_merges(Path(tmp)), model_max_length=max_length,
                                pad_token="<|endoftext|>")
    return tok
