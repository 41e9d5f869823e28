"""ShapesWorld: grammar, splits, renderer and the exact verifier."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from margrpo.testbed import (
    CATEGORIES,
    SceneSpec,
    ObjectGroup,
    applicable,
    detect,
    draw,
    enumerate_prompts,
    evaluate,
    format_prompt,
    load_prompts,
    parse_prompt,
    render_batch,
    render_prompt,
    sample_layout,
    score,
)
from margrpo.testbed.render import GAP
from margrpo.testbed.splits import make_splits
from margrpo.testbed.world import COLOR_NAMES, RELATIONS, SHAPES

ALL_PROMPTS = [p for c in CATEGORIES for p in enumerate_prompts(c)]
KEYS = ("color", "shape", "count", "spatial", "overall")


def random_prompts(n: int, seed: int, category: str | None = None) -> list[str]:
    pool = enumerate_prompts(category) if category else ALL_PROMPTS
    rng = np.random.default_rng(seed)
    return [pool[i] for i in rng.integers(0, len(pool), n)]


def to_batch(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images))  # uint8 [B, H, W, 3]


# ---------------------------------------------------------------- grammar


def test_every_canonical_prompt_round_trips_with_its_category():
    for category in CATEGORIES:
        prompts = enumerate_prompts(category)
        assert len(prompts) == len(set(prompts)) > 0
        for prompt in prompts:
            spec = parse_prompt(prompt)
            assert format_prompt(spec) == prompt
            assert spec.category == category


def test_parse_reads_structure_and_is_case_and_space_insensitive():
    spec = parse_prompt("  A yellow  circle LEFT of a red square ")
    assert spec == SceneSpec((ObjectGroup(1, "yellow", "circle"), ObjectGroup(1, "red", "square")), "left of")
    assert parse_prompt("three green triangles") == SceneSpec((ObjectGroup(3, "green", "triangle"),))
    # the parser accepts more than the shipped prompt lists contain
    two = parse_prompt("two red squares and a blue circle")
    assert two.num_objects == 3 and two.category == "binding"


def test_unknown_words_raise_value_error_naming_them():
    with pytest.raises(ValueError, match=r"'purple'.*'hexagon'"):
        parse_prompt("a purple hexagon and a red square")


@pytest.mark.parametrize(
    "prompt, why",
    [
        ("", "empty"),
        ("red square circle", "count word"),
        ("a red squares", "singular"),
        ("three red square", "plural"),
        ("a red square and", "incomplete"),
        ("two red squares left of a blue circle", "single object"),
        ("a red square and a red square", "same kind"),
        ("four red squares and a blue circle", "at most 4"),
        ("a red square a blue circle", "'and' or a relation"),
    ],
)
def test_ungrammatical_prompts_raise_value_error(prompt, why):
    with pytest.raises(ValueError, match=why):
        parse_prompt(prompt)


# ---------------------------------------------------------------- splits


def test_shipped_splits_are_the_seeded_disjoint_partition_of_all_prompts():
    train, heldout = load_prompts("train"), load_prompts("heldout")
    expected = make_splits()
    assert train == expected["train"] and heldout == expected["heldout"]
    assert not set(train) & set(heldout)
    assert sorted(train + heldout) == sorted(ALL_PROMPTS)
    for category in CATEGORIES:  # every category is represented on both sides
        assert any(parse_prompt(p).category == category for p in heldout)
        assert any(parse_prompt(p).category == category for p in train)
    with pytest.raises(ValueError, match="split"):
        load_prompts("test")


# ---------------------------------------------------------------- renderer


def test_render_is_seeded_and_layouts_respect_gaps_and_relations():
    prompts = random_prompts(64, seed=1)
    assert torch.equal(render_batch(prompts, 7), render_batch(prompts, 7))
    assert not torch.equal(render_batch(prompts, 7), render_batch(prompts, 8))
    rng = np.random.default_rng(3)
    for prompt in prompts:
        spec = parse_prompt(prompt)
        layout = sample_layout(spec, rng)
        assert [(o.color, o.shape) for o in layout] == [(g.color, g.shape) for g in spec.groups for _ in range(g.count)]
        for i, a in enumerate(layout):
            assert 0 < a.x and a.x + a.size < 32 and 0 < a.y and a.y + a.size < 32
            for b in layout[i + 1 :]:
                apart_x = a.x + a.size + GAP <= b.x or b.x + b.size + GAP <= a.x
                apart_y = a.y + a.size + GAP <= b.y or b.y + b.size + GAP <= a.y
                assert apart_x or apart_y
        if spec.relation:
            axis, sign = RELATIONS[spec.relation]
            assert sign * (layout[0].center[axis] - layout[1].center[axis]) > 0


def test_render_batch_is_float_chw_in_unit_range():
    images = render_batch(["a red square", "two cyan circles"], 0)
    assert images.shape == (2, 3, 32, 32) and images.dtype == torch.float32
    assert images.min() == 0 and images.max() <= 1


# ---------------------------------------------------------------- verifier on ground truth


@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_scores_one_on_every_key(category):
    prompts = random_prompts(96, seed=hash(category) % 1000, category=category)
    images = render_batch(prompts, 11)
    scores = score(images, prompts)
    assert set(scores) == set(KEYS)
    for key in KEYS:
        assert scores[key].shape == (96,) and scores[key].dtype == torch.float32
        assert torch.all(scores[key] == 1), (key, [p for p, s in zip(prompts, scores[key]) if s < 1][:3])


def test_ground_truth_at_64_pixels_and_uint8_input():
    prompts = random_prompts(16, seed=5)
    rng = np.random.default_rng(5)
    images = to_batch([render_prompt(p, rng, image_size=64)[0] for p in prompts])  # uint8 [B, 64, 64, 3]
    assert all(torch.all(v == 1) for v in score(images, prompts).values())
    floats = images.permute(0, 3, 1, 2).float() / 255
    for key, value in score(floats, prompts).items():
        assert torch.equal(value, score(images, prompts)[key])


def test_mild_noise_keeps_ground_truth_correct():
    prompts = random_prompts(64, seed=6)
    images = render_batch(prompts, 6)
    noisy = (images + 0.05 * torch.randn(images.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    assert torch.all(score(noisy, prompts)["overall"] == 1)


def test_detect_finds_every_rendered_object_at_its_place():
    prompts = random_prompts(32, seed=9)
    rng = np.random.default_rng(9)
    rendered = [render_prompt(p, rng) for p in prompts]
    found = detect(to_batch([image for image, _ in rendered]))
    for b, (_, layout) in enumerate(rendered):
        mine = found.image == b
        assert int(mine.sum()) == len(layout)
        for obj in layout:
            same = mine & (found.color == COLOR_NAMES.index(obj.color)) & (found.shape == SHAPES.index(obj.shape))
            distance = (found.center[same] - torch.tensor(obj.center, dtype=torch.float64)).norm(dim=1)
            assert distance.min() < 1.5  # triangle centroids sit lower than the box center


# ---------------------------------------------------------------- verifier on perturbed scenes


def perturbed_scores(category: str, perturb, n: int = 24, seed: int = 0):
    """Render n prompts of a category, perturb each layout, score the redrawn images."""
    prompts = random_prompts(n, seed, category)
    rng = np.random.default_rng(seed)
    images = []
    for prompt in prompts:
        layout = sample_layout(parse_prompt(prompt), rng)
        images.append(draw(perturb(prompt, layout, rng)))
    return score(to_batch(images), prompts)


def assert_drop(scores, dropped: str, unchanged: tuple[str, ...]):
    assert torch.all(scores[dropped] < 1), dropped
    assert torch.all(scores["overall"] < 1)
    for key in unchanged:
        assert torch.all(scores[key] == 1), key


def other_color(prompt: str, rng) -> str:
    used = {g.color for g in parse_prompt(prompt).groups}
    return str(rng.choice([c for c in COLOR_NAMES if c not in used]))


def test_wrong_color_lowers_color_only():
    def recolor(prompt, layout, rng):
        return [dataclasses.replace(layout[0], color=other_color(prompt, rng)), *layout[1:]]

    assert_drop(perturbed_scores("binding", recolor), "color", ("shape", "spatial"))
    assert_drop(perturbed_scores("single", recolor), "color", ("shape", "spatial"))


def test_wrong_shape_lowers_shape_only():
    def reshape(prompt, layout, rng):
        used = {g.shape for g in parse_prompt(prompt).groups}
        shape = str(rng.choice([s for s in SHAPES if s not in used]))
        return [dataclasses.replace(layout[0], shape=shape), *layout[1:]]

    assert_drop(perturbed_scores("binding", reshape), "shape", ("color", "spatial"))


def test_missing_object_lowers_count_and_presence_in_proportion():
    def drop_last(prompt, layout, rng):
        return layout[:-1]

    for category in ("counting", "binding"):
        scores = perturbed_scores(category, drop_last)
        assert_drop(scores, "count", ("spatial",))
        # one asked object is missing: "n green triangles" keeps (n-1)/n of its color and shape,
        # "a red square and a blue circle" keeps one of its two colors and shapes
        expected = []
        for prompt in random_prompts(24, 0, category):
            spec = parse_prompt(prompt)
            expected.append(0.5 if category == "binding" else 1 - 1 / spec.groups[0].count)
        expected = torch.tensor(expected)
        assert torch.allclose(scores["color"], expected) and torch.allclose(scores["shape"], expected)


def test_extra_object_lowers_count_only():
    def add_one(prompt, layout, rng):
        spec = parse_prompt(prompt)
        extra = ObjectGroup(1, other_color(prompt, rng), str(rng.choice(SHAPES)))
        return sample_layout(SceneSpec((*spec.groups, extra)), rng)

    for category in ("single", "binding", "counting"):
        assert_drop(perturbed_scores(category, add_one), "count", ("color", "shape", "spatial"))


def test_swapped_positions_lower_spatial_only():
    def swap(prompt, layout, rng):
        a, b = layout
        return [
            dataclasses.replace(a, color=b.color, shape=b.shape),
            dataclasses.replace(b, color=a.color, shape=a.shape),
        ]

    assert_drop(perturbed_scores("spatial", swap, n=48), "spatial", ("color", "shape", "count"))


def test_heavy_noise_lowers_scores_and_makes_no_objects():
    prompts = random_prompts(64, seed=12)
    images = render_batch(prompts, 12)
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(1))
    scores = score((images + 0.6 * noise).clamp(0, 1), prompts)
    assert scores["overall"].mean() < 0.3 and (scores["overall"] < 1).float().mean() > 0.9
    # pure noise: speckle is never taken for objects, so nothing asked for is found
    pure = score(torch.rand(images.shape, generator=torch.Generator().manual_seed(2)), prompts)
    assert torch.all(pure["color"] == 0) and torch.all(pure["overall"] == 0)


def test_blank_image_scores_zero_except_vacuous_spatial():
    prompts = ["a red square", "a red square left of a blue circle"]
    scores = score(torch.zeros(2, 3, 32, 32), prompts)
    assert scores["overall"].tolist() == [0.0, 0.0]
    assert scores["spatial"].tolist() == [1.0, 0.0]  # no relation to violate in the first prompt


# ---------------------------------------------------------------- partial credit


def square_image(side: int, color: str = "red", size: int = 32) -> torch.Tensor:
    """float [1, 3, size, size]: one filled square of `side` pixels of a palette color on black."""
    from margrpo.testbed.world import COLORS

    image = torch.zeros(1, 3, size, size)
    image[0, :, 4 : 4 + side, 4 : 4 + side] = torch.tensor(COLORS[color])[:, None, None]
    return image


@pytest.mark.parametrize("category", [None, "counting", "spatial"])
def test_partial_credit_equals_exact_on_rendered_and_mildly_noisy_scenes(category):
    prompts = random_prompts(48, seed=21, category=category)
    images = render_batch(prompts, 21)
    noisy = (images + 0.05 * torch.randn(images.shape, generator=torch.Generator().manual_seed(3))).clamp(0, 1)
    for batch in (images, noisy):
        exact, partial = score(batch, prompts), score(batch, prompts, partial_credit=True)
        for key in KEYS:
            torch.testing.assert_close(partial[key], exact[key], atol=1e-3, rtol=0)


def test_partial_credit_rises_with_a_near_object_where_exact_is_flat():
    # a 3x3 square (area 9) is below MIN_AREA 16: no object; it becomes one at 4x4
    sides = [2, 3, 4, 5]
    prompts = ["a red square"] * len(sides)
    images = torch.cat([square_image(s) for s in sides])
    exact = score(images, prompts)["color"].tolist()
    partial = score(images, prompts, partial_credit=True)["color"].tolist()
    assert exact == [0.0, 0.0, 1.0, 1.0]
    assert partial[0] == 0.0 and 0.0 < partial[1] < 1.0 and partial[2:] == [1.0, 1.0]
    # a wrong color earns nothing in either mode
    assert score(square_image(5, "blue"), ["a red square"], partial_credit=True)["color"].item() == 0.0


def test_partial_count_scores_the_distance_to_the_asked_count():
    # two 4x4 red squares (objects) and a 3x3 one (area 9 < MIN_AREA: a near-object of quality 1/8)
    image = square_image(4)
    image[0, :, 20:24, 20:24] = image[0, :, 4:8, 4:8]
    image[0, :, 4:7, 20:23] = image[0, :, 4:7, 4:7]
    found = detect(image, partial_credit=True)
    assert sorted(found.quality.tolist()) == pytest.approx([0.125, 1.0, 1.0])
    have = float((found.quality * found.shape_probs[:, SHAPES.index("square")]).sum())
    exact = score(image, ["two red squares"])["count"].item()
    partial = score(image, ["two red squares"], partial_credit=True)["count"].item()
    assert exact == 1.0  # the near-object is no object: two found, two asked
    # partial credit counts it as 1/8 of a square: both checks (group and total) score 1 - 1/8
    assert partial == pytest.approx(1 - abs(have - 2), abs=1e-5) and 0.85 < partial < 0.9


def test_shapes_reward_partial_credit_option():
    from margrpo.rewards import build_reward

    images = torch.cat([square_image(3), square_image(5)])
    prompts = ["a red square", "a red square"]
    exact = build_reward("shapes").score(images, prompts, None)
    partial = build_reward("shapes", partial_credit=True).score(images, prompts, None)
    assert exact[0] == 0 and 0 < partial[0] < partial[1] == exact[1] == 1
    with pytest.raises(ValueError, match="partial_credit"):
        build_reward("shapes", partial_credit="yes")


# ---------------------------------------------------------------- verifier API


def test_applicable_and_evaluate_average_only_where_a_category_applies():
    prompts = ["a red square", "a red square left of a blue circle"]
    masks = applicable(prompts)
    assert masks["spatial"].tolist() == [False, True] and masks["count"].all()
    images = render_batch(prompts, 0)
    images[1] = images[1].flip(-1)  # mirror: left of becomes right of
    summary = evaluate(images, prompts)
    assert summary["spatial"] == 0.0  # averaged over the one spatial prompt only
    assert summary["color"] == 1.0 and summary["exact"] == 0.5
    assert np.isnan(evaluate(images[:1], prompts[:1])["spatial"])


@pytest.mark.parametrize(
    "images, prompts, match",
    [
        (torch.zeros(2, 32, 32, 3), ["a red square"] * 2, r"images: float images must be \[B, 3, H, W\]"),
        (torch.zeros(2, 3, 32, 32, dtype=torch.uint8), ["a red square"] * 2, r"images: uint8 images"),
        (torch.zeros(2, 3, 32, 32), ["a red square"], "prompts: got 1 prompts for 2 images"),
        (torch.full((1, 3, 32, 32), float("nan")), ["a red square"], "NaN"),
        (torch.zeros(1, 3, 32, 32), ["a red pentagon"], "'pentagon'"),
    ],
)
def test_bad_inputs_raise_naming_the_argument(images, prompts, match):
    with pytest.raises(ValueError, match=match):
        score(images, prompts)
