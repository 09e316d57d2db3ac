"""The built-in synthetic "shapes" captions: offline, deterministic, with boxes.

Each image shows 1 to 3 coloured shapes on a black background; the captions
follow the grammar in `components/synthetic/shapes_grammar.py` ("a large red
circle to the left of a small blue square"). Placement keeps every caption
unambiguous: objects never overlap and keep a gap, the o1/o2 displacement is
clearly horizontal or clearly vertical, and with three objects the rightmost
is clearly to the right of the other two. Each (color, shape) pair appears at
most once per image, so a named object identifies its box.

Image ``i`` depends only on ``(seed, i)``: the same seed gives byte-identical
PNGs, and ``generate(n, start=k)`` yields images ``k .. k+n-1`` of the same
stream (for sharding or splits).
"""
from __future__ import annotations

import io
from typing import Iterator

import numpy as np
from PIL import Image

from components.contract.raw_example import RawExample
from components.synthetic import check_generator_args
from components.synthetic import shapes_grammar as grammar

SUPERSAMPLE = 4          # sub-pixels per pixel side, for antialiased edges
EDGE = 0.02              # min distance of a box from the image border
GAP = 0.05               # min distance between two boxes (both axes' gaps)
RELATION_MARGIN = 0.10   # min | |dx| - |dy| | between o1 and o2 centres
ORDER_MARGIN = 0.10      # 3 objects: min x gap between 2nd and 3rd centre
COLOR_JITTER = 15        # +- per RGB channel, per object
CROSS_THICKNESS = 0.36   # arm width of the cross, as a fraction of its side
_CANDIDATES = 64         # placements tried per vectorized batch
_MAX_BATCHES = 100


def generate(num_images: int, image_size: int = 64, min_objects: int = 1,
             max_objects: int = 3, captions_per_image: int = 5, seed: int = 0,
             *, start: int = 0, noise: float = 3.0) -> Iterator[RawExample]:
    """Yields synthetic shapes images with captions and ground-truth boxes.

    Args:
      num_images: how many images.
      image_size: side of the square RGB image in pixels.
      min_objects, max_objects: objects per image, uniform in this range (1..3).
      captions_per_image: reference captions per image (the primary one first).
      seed: the stream's seed; image i depends only on (seed, i).
      start: index of the first image (ids continue from it).
      noise: standard deviation of the Gaussian pixel noise (0 = clean).
    Yields:
      `RawExample`s with `image_id` "shapes-000123", PNG `image_bytes`,
      `captions`, and `objects`: dicts with `bbox` (ymin, xmin, ymax, xmax,
      normalized), `color`, `shape`, `size`, in the primary caption's order.
    """
    check_generator_args(min_objects, max_objects, 3, image_size, 16, captions_per_image)
    for index in range(start, start + num_images):
        yield make_example(index, image_size=image_size, min_objects=min_objects,
                           max_objects=max_objects, captions_per_image=captions_per_image,
                           seed=seed, noise=noise)


def make_example(index: int, image_size: int = 64, min_objects: int = 1,
                 max_objects: int = 3, captions_per_image: int = 5, seed: int = 0,
                 noise: float = 3.0) -> RawExample:
    """Image `index` of the stream `seed` (see `generate`)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(index)]))
    n = int(rng.integers(min_objects, max_objects + 1))
    objects = _sample_objects(n, rng)
    image = render(objects, image_size, rng, noise=noise)
    ordered, captions = grammar.make_captions(objects, captions_per_image, rng)
    buffer = io.BytesIO()
    # Level 1: the noise makes higher levels slow for a few % smaller files.
    Image.fromarray(image).save(buffer, format="PNG", compress_level=1)
    return RawExample(image_id=f"shapes-{index:06d}", image_bytes=buffer.getvalue(),
                      captions=tuple(captions),
                      objects=tuple({"bbox": o["bbox"], "color": o["color"],
                                     "shape": o["shape"], "size": o["size"]} for o in ordered))


def _sample_objects(n: int, rng: np.random.Generator) -> list[dict]:
    """Attributes and a valid placement for n objects."""
    pairs = [(c, s) for c in grammar.COLORS for s in grammar.SHAPES]
    chosen = rng.choice(len(pairs), size=n, replace=False)
    sizes = [list(grammar.SIZES)[i] for i in rng.integers(0, len(grammar.SIZES), size=n)]
    # Balance "left of" and "above" pairs (unconstrained, vertical pairs win 2:1
    # because the two leftmost objects tend to share a column).
    horizontal = bool(rng.integers(0, 2))
    for attempt in range(_MAX_BATCHES):
        if attempt == _MAX_BATCHES // 2:  # crowded: fall back to small objects
            sizes = ["small"] * n
        sides = np.array([rng.uniform(*grammar.SIZES[s]) for s in sizes])
        # (candidates, n) centres, each box fully inside the border
        lo, hi = EDGE + sides / 2, 1 - EDGE - sides / 2
        cy = rng.uniform(lo, hi, size=(_CANDIDATES, n))
        cx = rng.uniform(lo, hi, size=(_CANDIDATES, n))
        ok = _valid(cy, cx, sides, horizontal)
        if ok.any():
            k = int(np.argmax(ok))
            objects = []
            for j in range(n):
                half = sides[j] / 2
                color, shape = pairs[chosen[j]]
                box = (cy[k, j] - half, cx[k, j] - half, cy[k, j] + half, cx[k, j] + half)
                objects.append({"bbox": tuple(round(float(v), 6) for v in box), "color": color,
                                "shape": shape, "size": sizes[j], "side": float(sides[j])})
            return objects
    raise RuntimeError(f"could not place {n} objects")  # not reached for n <= 3


def _valid(cy: np.ndarray, cx: np.ndarray, sides: np.ndarray, horizontal: bool) -> np.ndarray:
    """(candidates,) bool: gaps kept, relation unambiguous along the wanted axis."""
    n = cy.shape[1]
    ok = np.ones(cy.shape[0], bool)
    for a in range(n):
        for b in range(a + 1, n):
            reach = (sides[a] + sides[b]) / 2 + GAP
            apart = (np.abs(cy[:, a] - cy[:, b]) >= reach) | (np.abs(cx[:, a] - cx[:, b]) >= reach)
            ok &= apart
    if n >= 2:
        order = np.argsort(cx, axis=1)
        rows = np.arange(cy.shape[0])
        first, second = order[:, 0], order[:, 1]
        dx = np.abs(cx[rows, second] - cx[rows, first])
        dy = np.abs(cy[rows, second] - cy[rows, first])
        ok &= ((dx - dy) if horizontal else (dy - dx)) >= RELATION_MARGIN
        if n == 3:
            ok &= cx[rows, order[:, 2]] - cx[rows, second] >= ORDER_MARGIN
    return ok


def render(objects: list[dict], image_size: int, rng: np.random.Generator,
           noise: float = 3.0) -> np.ndarray:
    """Draws the objects (antialiased) on a black background: (S, S, 3) uint8."""
    s = image_size
    image = np.zeros((s, s, 3), np.float32)
    f = SUPERSAMPLE
    for obj in objects:
        ymin, xmin, ymax, xmax = obj["bbox"]
        r0, r1 = max(0, int(np.floor(ymin * s)) - 1), min(s, int(np.ceil(ymax * s)) + 1)
        c0, c1 = max(0, int(np.floor(xmin * s)) - 1), min(s, int(np.ceil(xmax * s)) + 1)
        # sub-pixel centres in normalized coordinates
        ys = (r0 + (np.arange((r1 - r0) * f) + 0.5) / f) / s
        xs = (c0 + (np.arange((c1 - c0) * f) + 0.5) / f) / s
        mask = shape_mask(obj["shape"], ys[:, None], xs[None, :], obj["bbox"])
        alpha = mask.reshape(r1 - r0, f, c1 - c0, f).mean(axis=(1, 3))[..., None]
        base = np.array(grammar.COLORS[obj["color"]], np.float32)
        color = np.clip(base + rng.uniform(-COLOR_JITTER, COLOR_JITTER, 3), 0, 255)
        patch = image[r0:r1, c0:c1]
        image[r0:r1, c0:c1] = patch * (1 - alpha) + color * alpha
    if noise > 0:
        image += rng.normal(0.0, noise, image.shape).astype(np.float32)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def shape_mask(shape: str, y: np.ndarray, x: np.ndarray, bbox) -> np.ndarray:
    """Float mask (broadcast of y, x) of a shape filling its box.

    circle: the inscribed disc; square: the box; triangle: apex at the top
    centre, base along the bottom; cross: a plus sign with arms
    `CROSS_THICKNESS` of the side wide.
    """
    ymin, xmin, ymax, xmax = bbox
    cy, cx = (ymin + ymax) / 2, (xmin + xmax) / 2
    hy, hx = (ymax - ymin) / 2, (xmax - xmin) / 2
    u, v = (x - cx) / hx, (y - cy) / hy  # box mapped to [-1, 1]^2
    inside = (np.abs(u) <= 1) & (np.abs(v) <= 1)
    if shape == "circle":
        m = u ** 2 + v ** 2 <= 1
    elif shape == "square":
        m = inside
    elif shape == "triangle":
        m = inside & (np.abs(u) <= (v + 1) / 2)
    elif shape == "cross":
        t = CROSS_THICKNESS
        m = inside & ((np.abs(u) <= t) | (np.abs(v) <= t))
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return m.astype(np.float32)
