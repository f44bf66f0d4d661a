"""The contract every sharded image stage keeps (:mod:`counterfactory.generation.runner`), in the style of
diffusers' pipeline tester mixins: :class:`ShardContract` holds the tests, parametrised over the five stages;
each stage supplies a small case (config + inputs on tiny models, 2 items, one item per batch).

* a killed run (the stage's batch generator raises after its first batch; the second item's cache entry is left
  half written), rerun, writes the same files as an uninterrupted run, and the rerun does not generate the
  finished batch again;
* a rerun over a complete cache calls the generator not at all and writes the same files;
* the batch size changes no candidate, seed or parameter, and images at most by batched-kernel rounding;
* items split over 2 shards (and merged) give the same rows and image bytes as 1 shard;
* a merge refuses shards made with different configurations (``config_digest``) or without a recorded one;
* a merge refuses an incomplete set of shards (1 of 2): every merge checks the shards its plan says;
* shard summaries record the torch thread count next to the batch size;
* a second run on a shard folder that another live run is writing stops ("another run is writing this shard").

Stage-specific behaviour stays in each stage's own test file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from counterfactory.errors import InputError

REPO = Path(__file__).resolve().parents[1]


class Killed(RuntimeError):
    pass


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)


# --------------------------------------------------------------------------- stage cases
#
# A case supplies: ``stage`` (the runner.ShardStage subclass whose ``generate`` is the batch generator),
# ``run(out, batch_size=1, shard=None, variant=False)`` (all items, or shard ``shard`` of 1-item shards;
# ``variant``: another configuration), ``merge(dirs, out)`` (None: the stage's shards are not merged),
# ``result(folder) -> (rows, {image name: path})``, ``volatile`` (summary keys counting this run's work) and
# ``partial`` (a file of the second item's cache entry, written half by a kill during that item).


class ShardsCase:
    """COCO-Counterfactuals pairs (generation/shards.py): 2 captions, 2 candidates each."""

    name = "shards"
    volatile: tuple = ()
    partial = "work/101_1/sel_0_img_0.png"
    pairs = [("101_0", 0, "A man riding a horse on the beach.", "A man riding a cow on the beach."),
             ("101_1", 1, "Two dogs sitting on a couch.", "Two cats sitting on a couch.")]

    def __init__(self, root: Path):
        from counterfactory.filters import ClipScorer
        from counterfactory.generation import shards
        from counterfactory.models import tiny

        self.mod, self.stage = shards, shards.ImagePairStage
        self.models = {r: str(tiny.build(r, root)) for r in ("sd", "clip_filter", "vae")}
        self.engines: dict = {}
        self.scorer = ClipScorer.from_config(self.cfg())
        df = pd.DataFrame(self.pairs, columns=["caption_id", "source_index", "original", "counterfactual"])
        df.to_parquet(root / "pairs.parquet", index=False)
        self.table = root / "pairs.parquet"

    def cfg(self, batch_size=1, shard_size=2, variant=False):
        from counterfactory.config import load_config

        img = {"shard_size": shard_size, "candidates_per_pair": 2, "batch_size": batch_size, "steps": 2,
               "height": 32, "width": 32, "keep_work": True}
        if variant:
            img["guidance_range"] = [7.5, 8.0]
        return load_config([REPO / "config" / "demo.yaml"],
                           {"models": {r: {"source": s} for r, s in self.models.items()}, "images": img})

    def run(self, out, batch_size=1, shard=None, variant=False):
        from counterfactory.generation.sampler import build_engine

        cfg = self.cfg(batch_size, 2 if shard is None else 1, variant)
        if (batch_size, variant) not in self.engines:
            self.engines[batch_size, variant] = build_engine(cfg)
        return self.mod.run_shard(cfg, self.table, shard or 0, out, engine=self.engines[batch_size, variant],
                                  scorer=self.scorer, progress=False)

    def merge(self, dirs, out):
        return self.mod.merge_shards(dirs, out)

    def result(self, folder):
        sel = pd.read_parquet(folder / "selected_pairs.parquet")
        images = {f"{r.id}_{c}": folder / getattr(r, c) for r in sel.itertuples() for c in ("image_0", "image_1")}
        scores = pd.read_parquet(folder / "candidate_scores.parquet")
        return scores[["caption_id", "candidate_index", "seed", "p", "guidance"]], images


class SetsCase:
    """SocialCounterfactuals sets (generation/sets.py): 2 sets of 2 captions, 2 candidate sets each."""

    name = "sets"
    volatile: tuple = ()
    partial = "work/pg_pilot/c0000_m00.png"

    def __init__(self, root: Path):
        from counterfactory.generation import sets
        from counterfactory.generation.sampler import build_engine
        from counterfactory.models import tiny

        self.mod, self.stage = sets, sets.SetStage
        self.sd = str(tiny.build("sd", root))
        rows = []
        for sid, subject in (("pg_nurse", "nurse"), ("pg_pilot", "pilot")):
            for m, a2 in enumerate(("male", "female")):
                rows.append({"set_id": sid, "segment": "physical-gender", "prefix": "A photo of", "subject": subject,
                             "a1_type": "physical", "a1": "skinny", "a2_type": "gender", "a2": a2,
                             "caption": f"A photo of skinny {a2} {subject}", "member_index": m})
        pd.DataFrame(rows).to_parquet(root / "sets.parquet", index=False)
        self.table = root / "sets.parquet"
        self.engines = {False: build_engine(self.cfg()), True: build_engine(self.cfg(variant=True))}

    def cfg(self, batch_size=1, shard_size=2, variant=False):
        img = {"set_shard_size": shard_size, "candidates_per_set": 2, "batch_size": batch_size, "steps": 2,
               "height": 32, "width": 32, "attention_control": "ip2p_self", "p_range": [0.1, 0.9],
               "guidance_range": [7.5, 8.0] if variant else [7.5, 15.0], "scheduler": "euler_ancestral",
               "keep_work": True}
        return {"seed": 0, "device": "cpu", "precision": "fp32", "study": "social_counterfactuals",
                "models": {"sd": {"source": self.sd}}, "images": img}

    def run(self, out, batch_size=1, shard=None, variant=False):
        cfg = self.cfg(batch_size, 2 if shard is None else 1, variant)
        return self.mod.run_set_shard(cfg, self.table, shard or 0, out, engine=self.engines[variant],
                                      progress=False)

    def merge(self, dirs, out):
        return self.mod.merge_set_shards(dirs, out)

    def result(self, folder):
        t = pd.read_parquet(folder / "candidates.parquet")
        images = {f"{r.set_id}_{r.candidate_index}_{r.member_index}": folder / r.image_path for r in t.itertuples()}
        return t.drop(columns=["image_path"]), images


class GroundedCase:
    """CounterCurate GLIGEN text-box generation (generation/grounded.py): 2 ``generate`` requests."""

    name = "grounded"
    volatile: tuple = ()        # this run's work counts are logged, not written (resume is byte-identical)
    partial = "work/g2/image.png"

    def __init__(self, root: Path):
        from counterfactory.generation import grounded
        from counterfactory.models import registry, tiny

        self.mod, self.stage = grounded, grounded.GroundedStage
        self.gligen = str(tiny.build("gligen", root))
        self.pipes = {"gligen": registry.load(self.cfg(), "gligen")}
        rows = [{"item_id": "g1", "kind": "generate", "prompt": "a ball above a sports outfit",
                 "phrases": ["a ball", "a sports outfit"], "boxes": [[0.1, 0.05, 0.5, 0.4], [0.3, 0.5, 0.9, 0.95]]},
                {"item_id": "g2", "kind": "generate", "prompt": "a street above a child",
                 "phrases": ["a street"], "boxes": [[0.0, 0.0, 1.0, 0.5]]}]
        pd.DataFrame([{"image_path": None, "mask_box": None, **r} for r in rows]).to_parquet(root / "requests.parquet")
        self.table = root / "requests.parquet"

    def cfg(self, batch_size=1, shard_size=2, variant=False):
        section = {"steps": 2, "guidance": 3.0 if variant else 7.5, "height": 32, "width": 32,
                   "batch_size": batch_size, "shard_size": shard_size, "keep_work": True}
        return {"seed": 0, "device": "cpu", "precision": "fp32", "grounded": section,
                "models": {"gligen": {"source": self.gligen}}}

    def run(self, out, batch_size=1, shard=None, variant=False):
        cfg = self.cfg(batch_size, 2 if shard is None else 1, variant)
        return self.mod.run_grounded_shard(cfg, self.table, shard or 0, out, pipes=self.pipes, progress=False)

    def merge(self, dirs, out):
        return self.mod.merge_grounded_shards(dirs, out)

    def result(self, folder):
        t = pd.read_parquet(folder / "generated.parquet")
        return t.drop(columns=["image_path"]), {r.item_id: folder / r.image_path for r in t.itertuples()}


class InpaintCase:
    """Object removal with LaMa (generation/inpaint.py): 2 images, batched LaMa on the tiny model. Shards are
    row slices of the items table written to separate folders; they are not merged (each ``shard.parquet`` is
    read by the study)."""

    name = "inpaint"
    volatile: tuple = ()
    partial = "it1.png"

    def __init__(self, root: Path):
        from counterfactory.generation import inpaint
        from counterfactory.models import registry, tiny

        self.mod, self.stage = inpaint, inpaint.InpaintStage
        cfg = {"models": {"inpaint": {"source": str(tiny.build("inpaint", root)), "library": "lama_cleaner"}}}
        self.lama = registry.load(cfg, "inpaint", device="cpu")
        self.root = root
        rows = []
        for i in range(2):
            rng = np.random.default_rng(i)
            Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(root / f"src{i}.png")
            rows.append({"item_id": f"it{i}", "image_path": f"src{i}.png", "boxes": [[2 + i, 3, 20, 18]]})
        self.items = pd.DataFrame(rows)

    def run(self, out, batch_size=1, shard=None, variant=False):
        items = self.items if shard is None else self.items.iloc[shard:shard + 1]
        return self.mod.inpaint_shard(items, "lama", out, batch_size=batch_size, model=self.lama,
                                      image_root=self.root, progress=False)

    merge = None

    def result(self, folder):
        t = pd.concat([pd.read_parquet(p) for p in sorted(folder.glob("**/shard.parquet"))], ignore_index=True)
        return t.drop(columns=["output_path"]), {r.item_id: next(folder.glob(f"**/{r.output_path}"))
                                                 for r in t.itertuples()}


class EditingCase:
    """CVLD InstructPix2Pix edits (generation/editing.py): 2 images, m = 2 candidates, top k = 1. Shards are
    row slices of the items table, not merged (as inpaint)."""

    name = "editing"
    volatile: tuple = ()
    partial = "it1_0.png"

    def __init__(self, root: Path):
        from counterfactory.generation import editing
        from counterfactory.models import tiny_editing

        self.mod, self.stage = editing, editing.EditStage
        tiny_editing.build_editor(root / "editor")
        tiny_editing.build_image_encoder(root / "image_encoder")
        cfg = {"models": {role: {"source": str(root / role)} for role in ("editor", "image_encoder")}}
        self.editor, self.encoder = editing._load(cfg, "editor", "cpu"), editing._load(cfg, "image_encoder", "cpu")
        self.settings = editing.EditSettings(m=2, k=1, size=32, steps=2)
        self.root = root
        rows = []
        for i in range(2):
            rng = np.random.default_rng(10 + i)
            im = np.kron(rng.integers(0, 255, (4, 4, 3)), np.ones((8, 8, 1))).astype(np.uint8)
            Image.fromarray(im).save(root / f"img{i}.png")
            rows.append({"item_id": f"it{i}", "image_path": f"img{i}.png", "edit_prompt": "turn the man into a woman"})
        self.items = pd.DataFrame(rows)

    def run(self, out, batch_size=1, shard=None, variant=False):
        items = self.items if shard is None else self.items.iloc[shard:shard + 1]
        # batch_size counts candidates: m per batch is one item per batch
        return self.mod.edit_shard(items, "ip2p", out, settings=self.settings, batch_size=batch_size * 2,
                                   editor=self.editor, encoder=self.encoder, image_root=self.root, progress=False)

    merge = None

    def result(self, folder):
        t = pd.concat([pd.read_parquet(p) for p in sorted(folder.glob("**/shard.parquet"))], ignore_index=True)
        kept = t[t["kept"]]
        return t.drop(columns=["path", "similarity"]), {r.path: next(folder.glob(f"**/{r.path}"))
                                                       for r in kept.itertuples()}


CASES = {c.name: c for c in (ShardsCase, SetsCase, GroundedCase, InpaintCase, EditingCase)}


@pytest.fixture(scope="module")
def module_one_thread():
    """One torch thread for the whole module, the reference runs included (outputs are compared bytewise)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory, module_one_thread):
    root = tmp_path_factory.mktemp(request.param)
    c = CASES[request.param](root)
    c.ref = root / "ref"
    c.run(c.ref)          # the uninterrupted reference run: all items, one shard, one item per batch
    return c


#: the stages whose shards a merge step joins (inpaint and editing shards are read one by one, never merged)
MERGED = [name for name, c in CASES.items() if c.merge is not None]


@pytest.fixture(scope="module", params=MERGED)
def merged_case(request, tmp_path_factory, module_one_thread):
    return CASES[request.param](tmp_path_factory.mktemp(f"{request.param}-merge"))


# --------------------------------------------------------------------------- helpers


def _tree(folder: Path, volatile=()) -> dict:
    """Every file's sha256 (``summary.json``: its content without the keys counting this run's work)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file():
            continue
        if p.name == "summary.json":
            out[str(p.relative_to(folder))] = {k: v for k, v in json.loads(p.read_text()).items() if k not in volatile}
        else:
            out[str(p.relative_to(folder))] = _sha(p)
    return out


@pytest.fixture
def spy(monkeypatch):
    """Wrap a stage's batch generator: count its batches, raise :class:`Killed` after ``kill_after`` of them
    or fail on any call (``forbid``)."""

    def install(stage_cls, kill_after=None, forbid=False):
        calls = []
        original = stage_cls.generate

        def generate(self, batch):
            if forbid:
                raise AssertionError("the batch generator ran although every item was cached")
            if kill_after is not None and len(calls) >= kill_after:
                raise Killed(f"killed before batch {len(calls)}")
            calls.append(batch)
            yield from original(self, batch)

        monkeypatch.setattr(stage_cls, "generate", generate)
        return calls

    return install


# --------------------------------------------------------------------------- the contract


class ShardContract:
    def test_kill_and_resume_is_byte_identical(self, case, tmp_path, spy, monkeypatch):
        out = tmp_path / "killed"
        spy(case.stage, kill_after=1)
        with pytest.raises(Killed):
            case.run(out)
        (out / case.partial).parent.mkdir(parents=True, exist_ok=True)
        (out / case.partial).write_bytes(b"half")     # killed while writing the second item
        monkeypatch.undo()
        calls = spy(case.stage)
        case.run(out)
        assert len(calls) == 1                      # the first batch's item came from the cache
        assert _tree(out, case.volatile) == _tree(case.ref, case.volatile)

    def test_rerun_is_a_cache_hit(self, case, tmp_path, spy):
        out = tmp_path / "again"
        shutil.copytree(case.ref, out)
        spy(case.stage, forbid=True)
        case.run(out)
        assert _tree(out, case.volatile) == _tree(case.ref, case.volatile)

    def test_batch_size_changes_images_only_by_rounding(self, case, tmp_path):
        case.run(tmp_path / "b2", batch_size=2)
        rows, images = case.result(case.ref)
        rows2, images2 = case.result(tmp_path / "b2")
        pd.testing.assert_frame_equal(rows, rows2)
        assert images.keys() == images2.keys()
        for name in images:
            diff = np.abs(_pixels(images[name]) - _pixels(images2[name]))
            assert diff.max() <= 2 and (diff > 0).mean() < 0.05, name

    def test_shard_layout_changes_nothing(self, case, tmp_path):
        dirs = [tmp_path / "split" / f"{i:05d}" for i in range(2)]
        for i, d in enumerate(dirs):
            case.run(d, shard=i)
        if case.merge is not None:
            case.merge(dirs, tmp_path / "split")
        rows, images = case.result(case.ref)
        rows2, images2 = case.result(tmp_path / "split")
        pd.testing.assert_frame_equal(rows, rows2)
        assert {k: _sha(p) for k, p in images.items()} == {k: _sha(p) for k, p in images2.items()}

    def test_merge_refuses_mixed_config_digests(self, merged_case, tmp_path):
        case = merged_case
        a, b = tmp_path / "m" / "00000", tmp_path / "m" / "00001"
        case.run(a, shard=0)
        case.run(b, shard=1, variant=True)
        with pytest.raises(InputError, match="different configurations") as err:
            case.merge([a, b], tmp_path / "m")
        assert str(b / "summary.json") in str(err.value)
        assert not (tmp_path / "m" / "summary.json").exists()
        # a summary without a digest (written by an older version) is refused too
        case.run(b, shard=1)
        summary = json.loads((b / "summary.json").read_text())
        del summary["config_digest"]
        (b / "summary.json").write_text(json.dumps(summary))
        with pytest.raises(InputError, match="no config_digest"):
            case.merge([a, b], tmp_path / "m")

    def test_merge_refuses_missing_shards(self, merged_case, tmp_path):
        case = merged_case
        a, b = tmp_path / "p" / "00000", tmp_path / "p" / "00001"
        case.run(a, shard=0)
        case.run(b, shard=1)
        for given in ([a], [b]):
            with pytest.raises(InputError, match="missing"):
                case.merge(given, tmp_path / "p")
        with pytest.raises(InputError, match="shard 0 is also in|listed twice"):
            case.merge([a, a, b], tmp_path / "p")
        assert not (tmp_path / "p" / "summary.json").exists()
        merged = case.merge([a, b], tmp_path / "p")
        assert merged["threads"] == 1            # the module runs torch with one thread

    def test_summary_records_threads_next_to_batch_size(self, merged_case, tmp_path):
        merged_case.run(tmp_path / "t", batch_size=2)
        summary = json.loads((tmp_path / "t" / "summary.json").read_text())
        assert summary["batch_size"] == 2 and summary["threads"] == 1


def test_second_run_on_a_live_shard_folder_is_refused(tmp_path):
    import os
    import subprocess
    import sys

    from counterfactory.generation import runner

    out = tmp_path / "shard"
    with runner.shard_lock(out) as lock:
        assert lock.exists()
        with pytest.raises(runner.ShardLockedError, match="another run is writing this shard"):
            with runner.shard_lock(out):
                pass
    assert not lock.exists()                     # released on exit
    # a lock left by a killed run (its pid no longer runs) is taken over
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    lock.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    with runner.shard_lock(out):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()
    # the stages' shard functions hold the lock: a live holder stops them before any work
    lock.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    from counterfactory.generation import grounded

    with pytest.raises(runner.ShardLockedError, match=str(lock)):
        grounded.run_grounded_shard({}, tmp_path / "none.parquet", 0, out)
    assert lock.exists()                         # someone else's lock is left alone


class TestShardContract(ShardContract):
    pass
