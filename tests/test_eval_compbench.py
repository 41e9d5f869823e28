"""`margrpo eval --suite t2i-compbench`: the benchmark's scoring rules on synthetic detections, depths and
answers with known results, the prompt-file layout and its errors, the prompt reading, the suite's
table arithmetic with injected model outputs, the metric models on tiny random-init models in their
Hugging Face layouts, and the command end to end on a tiny ShapesWorld model. The prompt files are
written by the tests (a few lines in the benchmark's format), never the benchmark's own."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from conftest import make_tiny_checkpoint
from margrpo.eval_suites import build_suite
from margrpo.eval_suites import compbench_score as rules
from margrpo.eval_suites.compbench_data import CATEGORIES, CompBenchData, CompBenchDataError, sentence_key
from margrpo.eval_suites.compbench_text import RuleParser, build_parser
from margrpo.eval_suites.geneval_score import Box
from margrpo.rewards import MissingWeightsError
from margrpo.train import evaluate

EMPTY = str(Path(__file__).parent / "empty.yaml")
FILES = {
    "color_val.txt": ["a green bench and a blue bowl", "a red book and a blue cake"],
    "shape_val.txt": ["a round clock and a square bowl"],
    "texture_val.txt": ["a plastic toy and a glass bottle"],
    "spatial_val.txt": ["a dog on the left of a bench", "a cat near a dog"],
    "3d_spatial_val.txt": ["a dog in front of a bench"],
    "non_spatial_val.txt": ["a man is reading a book"],
    "numeracy_val.txt": ["two dogs and one cat"],
    "new_objects.txt": ["dog - dogs", "cat - cats", "teddy bear - teddy bears"],
    "complex_val.txt": ["The red dog was on the left of the blue bench.", "A man is reading a red book.", "The green cat is near the dog."],
    "complex_val_spatial.txt": ["The red dog was on the left of the blue bench."],
    "complex_val_action.txt": ["A man is reading a red book."],
}


# the same layout in the tiny ShapesWorld model's words (end-to-end test)
SHAPES_FILES = {
    "color_val.txt": ["a red square and a blue circle"],
    "shape_val.txt": ["a triangle and a square"],
    "texture_val.txt": ["a green circle and a yellow triangle"],
    "spatial_val.txt": ["a square left of a circle"],
    "3d_spatial_val.txt": ["a circle above a triangle"],
    "non_spatial_val.txt": ["an image of a red circle"],
    "numeracy_val.txt": ["two squares and a circle"],
    "new_objects.txt": ["square - squares", "circle - circles"],
    "complex_val.txt": ["a red square left of a blue circle"],
    "complex_val_spatial.txt": [],
    "complex_val_action.txt": [],
}


def write_data(root: Path, skip: tuple[str, ...] = (), files: dict[str, list[str]] = FILES) -> Path:
    folder = root / "examples" / "dataset"  # the layout of a checkout of the benchmark
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        if name not in skip:
            (folder / name).write_text("\n".join(lines) + "\n")
    return root


def box(cx: float, cy: float, size: float = 0.2, score: float = 0.9) -> Box:
    return Box(cx - size / 2, cy - size / 2, cx + size / 2, cy + size / 2, score)


# ---------------------------------------------------------------------- the scoring rules, known answers
def test_attribute_score_is_the_product_over_the_first_eight_phrases():
    assert rules.attribute_score([]) == 1.0
    assert rules.attribute_score([0.5, 0.8]) == pytest.approx(0.4)
    assert rules.attribute_score([0.5] * 8 + [0.0]) == pytest.approx(0.5**8)  # a ninth phrase is not asked


@pytest.mark.parametrize(
    "locality, subject, expected",
    [
        ("on the left of", (0.2, 0.5), 1.0),
        ("on the left of", (0.8, 0.5), 0.0),
        ("on the right of", (0.8, 0.5), 1.0),
        ("on the top of", (0.5, 0.2), 1.0),
        ("on the bottom of", (0.5, 0.8), 1.0),
        ("on the top of", (0.5, 0.8), 0.0),
        ("on the left of", (0.3, 0.1), 0.0),  # offset mostly vertical: not "left of"
        ("on top of", (0.5, 0.2), 0.0),  # not a locality the benchmark's position rule handles
        ("near", (0.7, 0.9), 1.0),  # within 150 / 512 of the side on one axis
    ],
)
def test_position_2d(locality, subject, expected):
    assert rules.position_2d(locality, box(*subject), box(0.5, 0.5)) == pytest.approx(expected)


def test_position_2d_overlap_and_distance_fall_off():
    # boxes overlapping by IoU 1/3 (>= 0.1): 0.1 / IoU
    a, b = Box(0.0, 0.0, 0.4, 0.2, 0.9), Box(0.2, 0.0, 0.6, 0.2, 0.9)
    assert rules.box_iou(a, b) == pytest.approx(1 / 3)
    assert rules.position_2d("on the left of", a, b) == pytest.approx(0.3)
    far = rules.position_2d("next to", box(0.05, 0.05, 0.1), box(0.95, 0.95, 0.1))
    assert far == pytest.approx((150 / 512) / 0.9)


def test_pair_score_weights_and_the_2d_cut():
    both = rules.pair_score(box(0.2, 0.5, score=0.8), box(0.8, 0.5, score=0.6), position=1.0, cut=0.5)
    assert both == pytest.approx(0.25 * 0.8 + 0.25 * 0.6 + 0.5)
    assert rules.pair_score(box(0.2, 0.5, score=0.8), None, position=0.0, cut=0.5) == 0.0  # 0.2 < 0.5
    assert rules.pair_score(None, box(0.2, 0.5, score=0.8), position=0.0) == pytest.approx(0.2)  # 3D: no cut
    assert rules.pair_score(None, None, position=1.0) == 0.0
    assert rules.pair_score(box(0.2, 0.5, score=0.4), box(0.8, 0.5, score=0.4), position=0.5, cut=0.5) == 0.0
    assert rules.pair_score(box(0.2, 0.5, score=0.4), box(0.8, 0.5, score=0.4), position=0.5) == pytest.approx(0.45)


@pytest.mark.parametrize(
    "locality, depths, shift, expected",
    [
        ("in front of", (0.8, 0.3), 0.0, 1.0),  # nearer, IoU 1 > 0.5
        ("in front of", (0.3, 0.8), 0.0, 0.0),  # farther
        ("behind", (0.3, 0.8), 0.0, 1.0),
        ("hidden", (0.3, 0.8), 0.0, 1.0),
        ("in front of", (0.8, 0.3), 0.12, 0.25 / 0.5),  # IoU 0.25 of two 0.2-boxes shifted by 0.12: IoU / 0.5
        ("in front of", (0.8, 0.3), 0.5, 0.0),  # no overlap
        ("near", (0.8, 0.3), 0.0, 0.0),
    ],
)
def test_position_3d(locality, depths, shift, expected):
    a, b = box(0.5, 0.5), box(0.5 + shift, 0.5)
    assert rules.position_3d(locality, a, b, *depths) == pytest.approx(expected, abs=1e-6)


def test_localities_are_found_in_the_benchmark_order():
    assert rules.first_locality("a cat on side of a dog near a tree", rules.LOCALITY_2D) == "on side of"
    assert rules.first_locality("A Dog On The Left Of a cat", rules.LOCALITY_2D) == "on the left of"
    assert rules.first_locality("a dog hidden by a desk", rules.LOCALITY_3D) == "hidden"
    assert rules.first_locality("a dog", rules.LOCALITY_2D) is None


def test_numeracy_objects_from_number_words_and_the_object_list():
    objects = {
        "dog": "dog",
        "dogs": "dog",
        "cat": "cat",
        "cats": "cat",
        "teddy bear": "teddy bear",
        "teddy bears": "teddy bear",
        "bowl": "bowl",
        "bowls": "bowl",
    }
    assert rules.numeracy_objects("three dogs, two cats and one bowl", objects) == [("dog", 3), ("cat", 2), ("bowl", 1)]
    assert rules.numeracy_objects("two teddy bears and a cat", objects) == [("teddy bear", 2), ("cat", 1)]
    assert rules.numeracy_objects("a teddy bear near six cats", objects) == [("teddy bear", 1), ("cat", 6)]
    assert rules.numeracy_objects("two horses", objects) == []  # not in the list


def test_numeracy_score_counts_distinct_detections():
    pixel = 1 / 512
    asked = [("cat", 2), ("dog", 1)]
    two_cats = [box(0.2, 0.5), box(0.7, 0.5)]
    assert rules.numeracy_score(asked, {"cat": two_cats, "dog": [box(0.5, 0.2)]}, pixel) == 1.0
    # a duplicate cat box (IoU > 0.9) counts once; two separate dogs: present, wrong count
    found = {"cat": two_cats + [box(0.2, 0.5, size=0.199)], "dog": [box(0.5, 0.2), box(0.5, 0.8)]}
    assert rules.numeracy_score(asked, found, pixel) == pytest.approx((1.0 + 0.5) / 2)
    inside = [Box(0.1, 0.1, 0.5, 0.5, 0.9), Box(0.15, 0.15, 0.45, 0.45, 0.8)]  # one 100% inside the other
    assert len(rules.distinct(inside, pixel)) == 1
    assert rules.numeracy_score(asked, {}, pixel) == 0.0
    assert rules.numeracy_score([], {"cat": two_cats}, pixel) == 0.0


def test_three_in_one_averages_the_parts_asked():
    assert rules.three_in_one(("attribute", "spatial"), 0.6, 0.2, 0.9) == pytest.approx(0.4)
    assert rules.three_in_one(("attribute", "action"), 0.6, 0.2, 0.9) == pytest.approx(0.75)
    assert rules.three_in_one(("attribute", "spatial", "action"), 0.6, 0.3, 0.9) == pytest.approx(0.6)


# ---------------------------------------------------------------------- the prompt files
def test_reads_the_checkout_layout_or_the_dataset_folder(tmp_path):
    root = write_data(tmp_path)
    data = CompBenchData.read(root)
    assert list(data.prompts) == list(CATEGORIES)
    assert data.prompts["color"] == FILES["color_val.txt"]
    assert data.objects["teddy bears"] == "teddy bear" and data.objects["dog"] == "dog"
    assert CompBenchData.read(root / "examples" / "dataset", ("color",)).prompts == {"color": FILES["color_val.txt"]}
    assert data.complex_parts("the red dog was on the left of the blue bench") == ("attribute", "spatial")
    assert data.complex_parts("A man is reading a red book.") == ("attribute", "action")
    assert data.complex_parts(FILES["complex_val.txt"][2]) == ("attribute", "spatial", "action")
    assert sentence_key(" The Cat. Sat.") == "the cat"


def test_missing_or_bad_files_are_named_with_the_source(tmp_path):
    root = write_data(tmp_path, skip=("numeracy_val.txt",))
    with pytest.raises(
        CompBenchDataError,
        match=r"missing file .*numeracy_val.txt: T2I-CompBench's numeracy_val.txt, "
        r"published at https://github.com/Karine-Huang/T2I-CompBench",
    ):
        CompBenchData.read(root)
    assert CompBenchData.read(root, ("color", "complex")).prompts["complex"]  # other categories need not it
    (root / "examples" / "dataset" / "numeracy_val.txt").write_text("two dogs\n")
    (root / "examples" / "dataset" / "new_objects.txt").write_text("dog - dogs\ncats\n")
    with pytest.raises(CompBenchDataError, match=r"new_objects.txt:2: got 'cats', expected 'singular - plural'"):
        CompBenchData.read(root, ("numeracy",))
    with pytest.raises(ValueError, match="categories: unknown colour"):
        CompBenchData.read(root, ("colour",))
    with pytest.raises(CompBenchDataError, match="is not a directory"):
        CompBenchData.read(tmp_path / "nowhere")


# ---------------------------------------------------------------------- reading the prompts' words
def test_rule_parser_reads_the_templated_prompts():
    parser = RuleParser()
    assert parser.noun_phrases("a green bench and a blue bowl") == ["a green bench", "a blue bowl"]
    assert parser.noun_phrases("A bathroom with white tile and a beige toilet.") == ["a bathroom", "white tile", "a beige toilet"]
    assert parser.noun_phrases("a table on the right of a man") == ["a table", "a man"]
    assert parser.spatial_pair("a giraffe next to a lamp") == ("giraffe", "lamp")
    assert parser.spatial_pair("a sheep hidden by a refrigerator") == ("sheep", "refrigerator")
    assert parser.spatial_pair("a dog in front of a desk") == ("dog", "desk")
    assert parser.complex_pair("The red hat was on top of the brown coat rack.") == ("hat", "rack")
    assert parser.complex_pair("The red hat and the coat.") is None
    assert parser.without_adjectives("The fluffy cat is on the left of the soft pillow.") == "the cat is on the left of the pillow"
    assert not parser.official


class FakeDoc(list):
    """What SpacyParser reads of a spaCy Doc: tokens with .text and .pos_, spans with .text, noun_chunks."""

    def __init__(self, tagged: str, chunks: list[str]):
        super().__init__(type("Token", (), {"text": w.split("/")[0], "pos_": w.split("/")[1]})() for w in tagged.split())
        self.noun_chunks = [type("Span", (), {"text": c})() for c in chunks]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return type("Span", (), {"text": " ".join(t.text for t in list.__getitem__(self, index))})()
        return list.__getitem__(self, index)


def test_spacy_reading_with_a_tagged_doc():
    """The benchmark's spaCy reading, on hand-tagged docs (spaCy itself need not be installed)."""
    from margrpo.eval_suites.compbench_text import SpacyParser

    docs = {
        "The red hat was on top of the coat rack": FakeDoc(
            "The/DET red/ADJ hat/NOUN was/AUX on/ADP top/NOUN of/ADP the/DET coat/NOUN rack/NOUN", ["The red hat", "top", "the coat rack"]
        ),
        "a table on the right of a man": FakeDoc(
            "a/DET table/NOUN on/ADP the/DET right/NOUN of/ADP a/DET man/NOUN", ["a table", "the right", "a man"]
        ),
        "Paris near the sea": FakeDoc("Paris/PROPN near/ADP the/DET sea/NOUN", ["Paris", "the sea"]),
        "a cat near a dog near a cow": FakeDoc("a/DET cat/NOUN near/ADP a/DET dog/NOUN near/ADP a/DET cow/NOUN", []),
    }
    parser = SpacyParser.__new__(SpacyParser)
    parser.nlp = docs.__getitem__
    assert parser.noun_phrases("The red hat was on top of the coat rack") == ["The red hat", "the coat rack"]
    assert parser.noun_phrases("a table on the right of a man") == ["a table", "a man"]  # "the right" left out
    assert parser.spatial_pair("a table on the right of a man") == ("table", "man")
    # the nouns next to the relation phrase: the nearest before, the first after ("coat", not "rack")
    assert parser.complex_pair("The red hat was on top of the coat rack") == ("hat", "coat")
    assert parser.complex_pair("Paris near the sea") == ("Paris", "sea")
    assert parser.complex_pair("a cat near a dog near a cow") is None  # two relations: four objects, not a pair
    assert parser.without_adjectives("The red hat was on top of the coat rack") == "The hat was on top of the coat rack"


def test_parser_choice():
    assert isinstance(build_parser("rules"), RuleParser)
    try:
        import spacy  # noqa: F401
    except ImportError:
        assert isinstance(build_parser(None), RuleParser)  # no spaCy: the labelled substitute
        with pytest.raises(ValueError, match="--spacy: cannot load the spaCy pipeline 'en_core_web_sm'"):
            build_parser("en_core_web_sm")  # asked for by name: an error, not a silent substitute


# ---------------------------------------------------------------------- the suite on tiny models
@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    pytest.importorskip("transformers")
    from margrpo.eval_suites.synthetic_metrics import write_compbench_models

    return write_compbench_models(tmp_path_factory.mktemp("compbench-models"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("compbench-data"))


@pytest.fixture(scope="module")
def suite(model_dirs, data_dir):
    return build_suite("t2i-compbench", data=str(data_dir), spacy="rules", device="cpu", **model_dirs)


def test_table_arithmetic_with_injected_model_outputs(suite):
    """Each category's score is the mean of the benchmark's rule over its images, from known answers,
    detections, depths and similarities."""
    suite = copy.copy(suite)
    suite.models = {}
    answers = {
        "a green bench?": 0.5,
        "a blue bowl?": 0.8,
        "a red book?": 0.9,
        "a blue cake?": 0.1,
        "a round clock?": 0.7,
        "a square bowl?": 0.7,
        "a plastic toy?": 1.0,
        "a glass bottle?": 0.3,
        "the red dog?": 0.6,
        "the blue bench?": 0.5,
        "a man?": 0.9,
        "the green cat?": 0.4,
        "the dog?": 1.0,
    }
    blip_calls = []

    class FakeBlip:
        def p_yes(self, images, questions, index):
            blip_calls.extend(questions)
            return torch.tensor([answers[q] for q in questions])

    suite.models["blip"] = FakeBlip()
    left, right = box(0.2, 0.5, score=0.8), box(0.8, 0.5, score=0.6)
    detections = {"dog": [left], "bench": [right], "cat": [box(0.4, 0.1, score=0.4)]}
    suite.models["detector"] = lambda images, words: [{w: detections.get(w, []) for w in ws} for ws in words]
    depth = torch.zeros(64, 64)
    depth[:, :32] = 1.0  # the left half is nearer: the dog (left box) is in front of the bench
    suite.models["depth"] = lambda images: depth.expand(images.shape[0], 64, 64)
    clip_calls = []

    class FakeClip:
        def cosine(self, images, texts):
            clip_calls.extend(texts)
            return torch.tensor([0.31 if "man" in t else 0.22 for t in texts])

    suite.models["clip"] = FakeClip()
    records = suite.prompts(10, seed=0)
    report = suite.score(torch.rand(len(records), 3, 64, 64), records)
    s = report.scores
    assert list(s) == list(CATEGORIES) and report.images["color"] == 2 and report.images["complex"] == 3
    assert s["color"] == pytest.approx((0.5 * 0.8 + 0.9 * 0.1) / 2)
    assert s["shape"] == pytest.approx(0.49) and s["texture"] == pytest.approx(0.3)
    # "a dog on the left of a bench": both found, left of: 0.25 * 0.8 + 0.25 * 0.6 + 1 / 2;
    # "a cat near a dog": 0.25 * 0.4 + 0.25 * 0.8 + near (1.0) / 2 = 0.8
    assert s["spatial"] == pytest.approx(((0.2 + 0.15 + 0.5) + (0.1 + 0.2 + 0.5)) / 2)
    # the dog's box has depth 1, the bench's 0, but they do not overlap: position 0, no cut
    assert s["3d_spatial"] == pytest.approx(0.2 + 0.15)
    assert s["non_spatial"] == pytest.approx(0.31)
    # "two dogs and one cat": one dog found (present, wrong count) 0.5, the cat found once 1.0
    assert s["numeracy"] == pytest.approx((0.5 + 1.0) / 2)
    complex_spatial = (0.6 * 0.5 + (0.2 + 0.15 + 0.5)) / 2  # "dog ... on the left ... bench"
    complex_action = (0.9 * 0.9 + 0.31) / 2
    complex_all = (0.4 * 1.0 + (0.1 + 0.2 + 0.5) + 0.22) / 3  # cat near dog; CLIP on the prompt without adjectives
    assert s["complex"] == pytest.approx((complex_spatial + complex_action + complex_all) / 3)
    assert "the cat is near the dog" in clip_calls  # "green" removed
    assert "a man?" in blip_calls and "a green bench?" in blip_calls
    details = {d["prompt"]: d for d in report.details}
    assert details["two dogs and one cat"]["objects"] == [("dog", 2), ("cat", 1)]
    assert details[FILES["complex_val.txt"][0]]["parts"] == {"attribute": pytest.approx(0.3), "spatial": pytest.approx(0.85)}
    assert sum(d["score"] for d in report.details if d["tag"] == "spatial") / 2 == pytest.approx(s["spatial"])


def test_every_table_labels_the_substitutes(suite, data_dir, tmp_path):
    records = suite.prompts(1, seed=0)
    report = suite.score(torch.rand(len(records), 3, 48, 48), records)
    table = report.table()
    rows = {
        line.split()[1] if line.startswith("t2i-compbench:") else line.split()[0]: line for line in table.splitlines()[1:] if line.strip()
    }
    for category in ("spatial", "3d_spatial", "numeracy", "complex"):
        assert "SUBSTITUTE for UniDet" in rows[category]
    assert "SUBSTITUTE" not in rows["non_spatial"] and "SUBSTITUTE" not in rows["color"]
    assert "rules (substitute for spaCy en_core_web_sm)" in rows["color"]  # the prompt words' reading, named
    out = report.write(tmp_path / "cb.json")
    markdown = out.with_suffix(".md").read_text()
    header = markdown.splitlines()[0]
    assert header == "| color* | shape* | texture* | spatial* | 3d_spatial* | non_spatial | numeracy* | complex* |"
    assert "not comparable with published T2I-CompBench numbers" in markdown
    assert all(0.0 <= v <= 1.0 for k, v in report.scores.items() if k != "non_spatial")
    saved = json.loads(out.read_text())
    assert saved["substitutes"] == ["color", "shape", "texture", "spatial", "3d_spatial", "numeracy", "complex"]


def test_blip_clip_and_depth_run_on_tiny_models(model_dirs):
    from margrpo.eval_suites import compbench_models as m

    cpu = torch.device("cpu")
    images = torch.rand(2, 3, 40, 40)
    blip = m.BlipVQA(model_dirs["blip"], cpu, torch.float32)
    p = blip.p_yes(images, ["a green bench?", "A Blue Bowl.", "a green bench?"], [0, 0, 1])
    assert p.shape == (3,) and ((p > 0) & (p < 1)).all()
    assert p[0] != p[2]  # the image matters
    alone = blip.p_yes(images[1:], ["a green bench?"], [0])
    torch.testing.assert_close(alone, p[2:], rtol=1e-4, atol=1e-5)  # batching does not change an answer
    assert m.clean_question("A Blue (Bowl)!?") == "a blue bowl?"
    depth = m.Depth(model_dirs["depth"], cpu, torch.float32)(images)
    assert depth.shape == (2, 40, 40) and depth.amin() == 0.0 and depth.amax() == 1.0
    assert m.mean_in_box(torch.arange(16.0).view(4, 4), Box(0.0, 0.5, 0.5, 1.0, 1.0)) == pytest.approx((8 + 9 + 12 + 13) / 4)  # rows are y
    cosine = m.Clip(model_dirs["clip"], cpu, torch.float32).cosine(images, ["a cat", "a dog"])
    assert cosine.shape == (2,) and (cosine.abs() <= 1).all()


def test_missing_models_and_data_are_named(model_dirs, data_dir, tmp_path):
    with pytest.raises(
        MissingWeightsError,
        match=r"t2i-compbench BLIP-VQA: weights dir not found: .*nowhere "
        r"\(option --blip; .*Salesforce/blip-vqa-base",
    ):
        build_suite("t2i-compbench", data=str(data_dir), **{**model_dirs, "blip": str(tmp_path / "nowhere")})
    empty = tmp_path / "depth"
    empty.mkdir()
    with pytest.raises(
        MissingWeightsError,
        match=r"missing file .*depth/preprocessor_config.json \(option --depth;.*"
        r"Intel/dpt-hybrid-midas",
    ):
        build_suite("t2i-compbench", data=str(data_dir), **{**model_dirs, "depth": str(empty)})
    with pytest.raises(MissingWeightsError, match=r"substitute for UniDet.*option --detector"):
        build_suite("t2i-compbench", data=str(data_dir), **{**model_dirs, "detector": str(tmp_path / "x")})
    # only the models of the categories asked for are needed
    only = build_suite("t2i-compbench", data=str(data_dir), categories="non_spatial", clip=model_dirs["clip"], device="cpu")
    assert set(only.models) == {"clip"} and only.parser is None
    with pytest.raises(ValueError, match="--data: required"):
        build_suite("t2i-compbench", clip=model_dirs["clip"])


# ---------------------------------------------------------------------- margrpo eval, end to end
@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory, depth=1)


def test_eval_compbench_end_to_end_on_a_shapesworld_model(tmp_path, tiny_checkpoint, model_dirs, capsys):
    data_dir = write_data(tmp_path / "benchmark", files=SHAPES_FILES)
    out = tmp_path / "compbench.json"
    args = [
        "--config",
        EMPTY,
        f"backbone.checkpoint={tiny_checkpoint}",
        "rollout.num_mask_steps=2",
        "rollout.record_mask_steps=1",
        "rollout.record_diffusion_steps=1",
        "run.threads=1",
        "--suite",
        "t2i-compbench",
        "--data",
        str(data_dir),
        "--per-category",
        "1",
        "--samples-per-prompt",
        "2",
        "--spacy",
        "rules",
        "--blip",
        model_dirs["blip"],
        "--clip",
        model_dirs["clip"],
        "--detector",
        model_dirs["detector"],
        "--depth",
        model_dirs["depth"],
        "--out",
        str(out),
    ]
    assert evaluate.main(args) == 0
    report = json.loads(out.read_text())
    assert list(report["scores"]) == list(CATEGORIES)
    assert report["images"] == {c: 2 for c in CATEGORIES}
    assert [d["prompt"] for d in report["details"]][:2] == [SHAPES_FILES["color_val.txt"][0]] * 2
    assert all(0.0 <= d["score"] <= 1.0 for d in report["details"] if d["tag"] != "non_spatial")
    printed = capsys.readouterr().out
    assert "SUBSTITUTE for UniDet" in printed and out.with_suffix(".md").is_file()
    from margrpo.config import ConfigError

    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ConfigError, match="--suite t2i-compbench: --data: missing file .*elsewhere/color_val.txt"):
        evaluate.main([*args, "--data", str(tmp_path / "elsewhere")])  # the last --data wins
