"""`margrpo eval --suite` (margrpo.eval_suites): GenEval-style prompts, the scoring rules on synthetic
detections with known answers, the detector + CLIP scorer on tiny random-init models of the real
architectures, and the whole command end to end on tiny random-init MAR models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import make_tiny_checkpoint
from margrpo.config import ConfigError
from margrpo.eval_suites import available_suites, build_suite
from margrpo.eval_suites.geneval_prompts import (
    CATEGORIES,
    COCO_CLASSES,
    COLORS,
    COUNT_WORDS,
    RELATIONS,
    geneval_prompts,
    plural,
    with_article,
)
from margrpo.eval_suites.geneval_score import Box, judge, relation_holds, summarize
from margrpo.prompt_files import parse_record
from margrpo.rewards import MissingWeightsError, synthetic
from margrpo.testbed import CATEGORIES as SHAPES_CATEGORIES
from margrpo.train import evaluate

EMPTY = str(Path(__file__).parent / "empty.yaml")


# ---------------------------------------------------------------------- prompts
def test_geneval_prompts_cover_the_six_categories_with_valid_metadata():
    records = geneval_prompts(per_category=30, seed=3)
    assert [r.tag for r in records[:6]] == list(CATEGORIES)  # categories in turn: any prefix is balanced
    by_tag = {c: [r for r in records if r.tag == c] for c in CATEGORIES}
    assert all(len(v) == 30 for v in by_tag.values())
    assert len({r.prompt for r in records}) == len(records)
    for r in records:
        assert parse_record({"prompt": r.prompt, **r.meta}, "generated") == r  # the JSONL schema
        assert all(o["class"] in COCO_CLASSES for o in r.meta["objects"])
    assert all(len(r.meta["objects"]) == 1 and r.meta["objects"][0].get("count", 1) == 1 for r in by_tag["single_object"])
    for r in by_tag["counting"]:
        obj = r.meta["objects"][0]
        assert obj["count"] in (2, 3, 4) and r.prompt == f"a photo of {COUNT_WORDS[obj['count']]} {plural(obj['class'])}"
    for r in by_tag["position"]:
        pos = r.meta["position"]
        assert pos["relation"] in RELATIONS and pos["subject"] != pos["object"] and pos["relation"] in r.prompt
    for r in by_tag["color_attr"]:
        colors = [o["color"] for o in r.meta["objects"]]
        assert len(set(colors)) == 2 and set(colors) <= set(COLORS)
    assert geneval_prompts(30, seed=3) == records and geneval_prompts(30, seed=4) != records
    # a category with fewer prompts than asked gives them all, once
    assert len([r for r in geneval_prompts(100, seed=0) if r.tag == "single_object"]) == len(COCO_CLASSES) == 80


def test_plurals_and_articles():
    assert [plural(n) for n in ("person", "wine glass", "bus", "knife", "couch", "sheep", "cup", "toothbrush")] == [
        "people",
        "wine glasses",
        "buses",
        "knives",
        "couches",
        "sheep",
        "cups",
        "toothbrushes",
    ]
    assert with_article("orange") == "an orange" and with_article("orange car") == "an orange car"
    assert with_article("red apple") == "a red apple"


# ---------------------------------------------------------------------- scoring rules, known answers
def box(cx: float, cy: float, size: float = 0.2, score: float = 0.9, color: str | None = None) -> Box:
    return Box(cx - size / 2, cy - size / 2, cx + size / 2, cy + size / 2, score, color)


@pytest.mark.parametrize("found, correct", [(3, True), (2, False), (4, False), (0, False)])
def test_counting_needs_exactly_the_count(found, correct):
    meta = {"objects": [{"class": "cup", "count": 3}]}
    ok, why = judge(meta, {"cup": [box(0.2 * i + 0.1, 0.5) for i in range(found)]})
    assert ok is correct and (why == "" if correct else "cup" in why)


def test_presence_tolerates_extra_instances_and_needs_every_class():
    assert judge({"objects": [{"class": "dog"}]}, {"dog": [box(0.3, 0.3), box(0.7, 0.7)]}) == (True, "")
    assert judge({"objects": [{"class": "dog"}, {"class": "cat"}]}, {"dog": [box(0.3, 0.3)]}) == (False, "no cat")


def test_colour_is_read_from_the_most_confident_box():
    meta = {"objects": [{"class": "car", "color": "green"}]}
    assert judge(meta, {"car": [box(0.5, 0.5, color="green"), box(0.2, 0.2, score=0.4, color="red")]})[0]
    ok, why = judge(meta, {"car": [box(0.5, 0.5, color="red")]})
    assert not ok and why == "car is red (asked green)"
    attr = {"objects": [{"class": "bowl", "color": "red"}, {"class": "chair", "color": "blue"}]}
    assert judge(attr, {"bowl": [box(0.3, 0.5, color="red")], "chair": [box(0.7, 0.5, color="blue")]})[0]
    assert not judge(attr, {"bowl": [box(0.3, 0.5, color="blue")], "chair": [box(0.7, 0.5, color="red")]})[0]


@pytest.mark.parametrize(
    "relation, subject, correct",
    [
        ("left of", (0.2, 0.5), True),
        ("left of", (0.8, 0.5), False),
        ("right of", (0.8, 0.5), True),
        ("above", (0.5, 0.1), True),
        ("above", (0.5, 0.9), False),
        ("below", (0.5, 0.9), True),
        ("left of", (0.47, 0.5), False),  # within the margin: not clearly left
    ],
)
def test_position_compares_box_centres_along_the_relations_axis(relation, subject, correct):
    meta = {"objects": [{"class": "dog"}, {"class": "bench"}], "position": {"subject": "dog", "relation": relation, "object": "bench"}}
    found = {"dog": [box(*subject)], "bench": [box(0.5, 0.5)]}
    assert judge(meta, found, margin=0.05)[0] is correct
    assert relation_holds(relation, box(*subject), box(0.5, 0.5), margin=0.0) is (correct or subject == (0.47, 0.5))


def test_summary_is_accuracy_per_category_and_their_mean():
    scores, counts = summarize(["a", "a", "b", "a"], [True, False, True, True])
    assert scores == {"a": pytest.approx(2 / 3), "b": 1.0, "overall": pytest.approx((2 / 3 + 1) / 2)}
    assert counts == {"a": 3, "b": 1, "overall": 4}


# ---------------------------------------------------------------------- the scorer on tiny real architectures
@pytest.fixture(scope="module")
def scorer_dirs(tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("scorers")
    detector = synthetic.write("grounding_dino", root)["path"]
    clip = str(synthetic.write_hf_clip(root / "clip", "tiny", seed=11))
    return detector, clip


@pytest.fixture(scope="module")
def geneval(scorer_dirs):
    return build_suite("geneval", detector=scorer_dirs[0], clip=scorer_dirs[1], device="cpu")


def test_scorer_thresholds_suppresses_duplicates_and_reads_colour_with_clip(geneval):
    from margrpo.eval_suites.geneval_detector import crop

    scorer = geneval.scorer
    image = torch.zeros(1, 3, 40, 40)
    image[0, 0, 10:30, 4:16] = 1.0  # a red block
    # the detector's output for phrases ["cup", "dog"]: 4 queries, boxes (cx, cy, w, h)
    boxes = torch.tensor([[0.25, 0.5, 0.3, 0.5], [0.26, 0.5, 0.3, 0.5], [0.75, 0.5, 0.2, 0.2], [0.5, 0.1, 0.1, 0.1]])
    phrase = torch.tensor([[0.9, 0.8, 0.7, 0.1], [0.1, 0.2, 0.2, 0.2]])
    scorer.detector.detect = lambda pixels, phrases: [(phrase, boxes)]
    try:
        meta = {"objects": [{"class": "cup", "color": "red"}, {"class": "dog"}]}
        found = scorer.detections(image, [meta])[0]
    finally:
        del scorer.detector.detect
    assert [round(b.score, 3) for b in found["cup"]] == [0.9, 0.7]  # query 1 overlaps query 0: suppressed
    assert found["dog"] == []  # below box_threshold
    top = found["cup"][0]
    assert (top.x1, top.y1, top.x2, top.y2) == pytest.approx((0.1, 0.25, 0.4, 0.75))
    # the colour is CLIP's zero-shot choice on the top box's crop
    pixels = crop(image[0], top, 32)
    assert pixels[0].min() == 1.0 and pixels[1:].max() == 0.0  # the crop lies inside the red block
    texts = scorer.clip.text_embeddings([f"a photo of a {c} cup" for c in COLORS])
    assert top.color == COLORS[int((texts @ scorer.clip.image_embeddings(pixels[None])[0]).argmax())]
    assert found["cup"][1].color is None  # only the top box is read
    assert scorer(image, [{"objects": []}]) == [(True, "")]  # nothing asked, nothing detected


def test_missing_scorer_weights_name_the_option_and_the_file(tmp_path, scorer_dirs):
    with pytest.raises(MissingWeightsError, match=r"geneval detector: weights dir not found: .*nowhere \(option --detector"):
        build_suite("geneval", detector=str(tmp_path / "nowhere"), clip=scorer_dirs[1], device="cpu")
    empty = tmp_path / "clip"
    empty.mkdir()
    with pytest.raises(MissingWeightsError, match=r"geneval colour classifier: missing file .*clip/config.json \(option --clip;"):
        build_suite("geneval", detector=scorer_dirs[0], clip=str(empty), device="cpu")


def test_suite_registry():
    assert available_suites() == ["shapes", "geneval", "t2i-compbench", "preference"]
    with pytest.raises(ValueError, match="suite 'shapes': does not take option.s. detector; accepted: none"):
        build_suite("shapes", detector="x")
    with pytest.raises(KeyError, match="unknown suite 'drawbench'"):
        build_suite("drawbench")


# ---------------------------------------------------------------------- margrpo eval --suite, end to end
@pytest.fixture(scope="module")
def nova_tiny(tmp_path_factory):
    pytest.importorskip("transformers")
    from margrpo.models import nova

    return nova.save_preset("nova-tiny", tmp_path_factory.mktemp("nova") / "nova-tiny", seed=3)


NOVA = [
    "backbone.name=nova",
    "backbone.diffusion_steps=2",
    "rollout.num_mask_steps=2",
    "rollout.record_mask_steps=1",
    "rollout.record_diffusion_steps=1",
    "run.device=cpu",
    "run.threads=1",
    "rewards={jpeg_incompressibility: 1.0}",
]


def test_eval_geneval_suite_end_to_end_on_a_tiny_nova(tmp_path, nova_tiny, scorer_dirs, capsys):
    out = tmp_path / "report.json"
    code = evaluate.main(
        [
            "--config",
            EMPTY,
            *NOVA,
            f"backbone.checkpoint={nova_tiny}",
            "--suite",
            "geneval",
            "--per-category",
            "1",
            "--samples-per-prompt",
            "2",
            "--detector",
            scorer_dirs[0],
            "--clip",
            scorer_dirs[1],
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert list(report["scores"]) == [*CATEGORIES, "overall"]
    assert report["images"] == {**{c: 2 for c in CATEGORIES}, "overall": 12}
    assert all(0.0 <= v <= 1.0 for v in report["scores"].values())
    assert report["scores"]["overall"] == pytest.approx(sum(report["scores"][c] for c in CATEGORIES) / 6)
    assert [d["tag"] for d in report["details"]] == [c for c in CATEGORIES for _ in range(2)]
    assert all(d["correct"] == (d["why"] == "") for d in report["details"])
    printed = capsys.readouterr().out
    assert all(c in printed for c in CATEGORIES) and f"report: {out}" in printed


def test_eval_geneval_scores_a_jsonl_prompt_file(tmp_path, nova_tiny, scorer_dirs):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "two cats", "tag": "mine", "objects": [{"class": "cat", "count": 2}]})
        + "\n"
        + json.dumps({"prompt": "a dog"})
        + "\n"
    )
    args = [
        "--config",
        EMPTY,
        *NOVA,
        f"backbone.checkpoint={nova_tiny}",
        "--suite",
        "geneval",
        "--samples-per-prompt",
        "2",
        "--detector",
        scorer_dirs[0],
        "--clip",
        scorer_dirs[1],
        "--out",
        str(tmp_path / "r.json"),
        "--prompts",
        str(prompts),
    ]
    with pytest.raises(ValueError, match="geneval: prompt 'a dog' has no 'objects' metadata"):
        evaluate.main(args)
    prompts.write_text(prompts.read_text().splitlines()[0] + "\n")
    assert evaluate.main(args) == 0
    assert list(json.loads((tmp_path / "r.json").read_text())["scores"]) == ["mine", "overall"]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def test_eval_shapes_suite_is_the_default_heldout_evaluation(tmp_path, tiny_checkpoint, capsys):
    common = [
        "--config",
        EMPTY,
        f"backbone.checkpoint={tiny_checkpoint}",
        "rollout.num_mask_steps=2",
        "rollout.record_mask_steps=1",
        "rollout.record_diffusion_steps=1",
        "run.eval_per_category=1",
        "run.eval_samples_per_prompt=1",
        "run.threads=1",
    ]
    assert evaluate.main(common) == 0
    default = dict(kv.split("=") for kv in capsys.readouterr().out.split())
    out = tmp_path / "shapes.json"
    assert evaluate.main([*common, "--suite", "shapes", "--out", str(out)]) == 0  # run.eval_per_category
    report = json.loads(out.read_text())
    assert {f"heldout/{k}": f"{v:.3f}" for k, v in report["scores"].items()} == default
    assert report["images"]["overall"] == len(SHAPES_CATEGORIES)  # one prompt of each, one sample
    with pytest.raises(ConfigError, match="--suite shapes: suite 'shapes': does not take option.s. detector"):
        evaluate.main([*common, "--suite", "shapes", "--detector", "x"])
