"""The built-in synthetic "scenes" captions: harder than shapes, offline, with boxes.

Each image shows 3 to 8 objects of 8 kinds, 9 colors and 3 sizes on a
textured background (dark, striped, checkered, spotted or shaded) with thin
clutter lines and specks. Objects are drawn in a random order and may
overlap: a later object hides part of an earlier one, but every object keeps
at least `MIN_VISIBLE` of its pixels in view. About half of the images hold
a group of 2 or 3 objects of the same color and kind, which captions count
("two pink hearts"). The captions follow `components/synthetic/scenes_grammar.py`:
each names a salient subset of the scene in varied words, so no caption is
the one right answer, as with human references.

Boxes are amodal: an object's `bbox` (ymin, xmin, ymax, xmax, normalized)
bounds its whole shape, hidden parts included, like the shapes boxes, so the
grounding metrics work unchanged. Image ``i`` depends only on ``(seed, i)``:
the same seed gives byte-identical PNGs, and ``generate(n, start=k)``
yields images ``k .. k+n-1`` of the same stream.
"""
from __future__ import annotations

import io
from typing import Iterator, NamedTuple

import numpy as np
from PIL import Image

from components.contract.raw_example import RawExample
from components.synthetic import check_generator_args
from components.synthetic import scenes_grammar as grammar

SUPERSAMPLE = 4          # sub-pixels per pixel side, for antialiased edges
EDGE = 0.01              # min distance of a box from the image border
MIN_VISIBLE = 0.5        # fraction of an object's pixels that stays in view
MIN_PIXELS = 12          # visible pixels every object keeps, at least
GROUP_PROB = 0.5         # images with a group of 2-3 same (color, kind) objects
SIZE_PROBS = (0.4, 0.35, 0.25)  # small, medium, large
COLOR_JITTER = 12        # +- per RGB channel, per object
CROSS_THICKNESS = 0.36   # arm width of the cross, as a fraction of its side
RING_INNER = 0.55        # inner radius of the ring, as a fraction of its outer radius
STAR_INNER = 0.45        # inner vertices of the star, as a fraction of its outer radius
MAX_OBJECTS = 8
_TRIES = 200             # placements tried per object (then it is made small)


class Scene(NamedTuple):
    """A rendered scene: the image, which object each pixel shows, and the objects.

    `owner` is (S, S) int: the index into `objects` (draw order) of the object
    drawn on top at that pixel (coverage >= 0.5), -1 for background.
    """
    image: np.ndarray
    owner: np.ndarray
    objects: list
    background: str


def generate(num_images: int, image_size: int = 64, min_objects: int = 3,
             max_objects: int = 8, captions_per_image: int = 5, seed: int = 0,
             *, start: int = 0, noise: float = 4.0) -> Iterator[RawExample]:
    """Yields synthetic scenes with captions and ground-truth boxes.

    Args:
      num_images: how many images.
      image_size: side of the square RGB image in pixels (>= 32).
      min_objects, max_objects: objects per image, uniform in this range (1..8).
      captions_per_image: reference captions per image.
      seed: the stream's seed; image i depends only on (seed, i).
      start: index of the first image (ids continue from it).
      noise: standard deviation of the Gaussian pixel noise (0 = clean).
    Yields:
      `RawExample`s with `image_id` "scenes-000123", PNG `image_bytes`,
      `captions`, and `objects`, most salient (visible area) first: dicts
      with `bbox` (ymin, xmin, ymax, xmax, normalized), `color`, `shape` (the
      kind), `size` and `visible` (the fraction of its pixels in view).
    """
    check_generator_args(min_objects, max_objects, MAX_OBJECTS, image_size, 32,
                         captions_per_image)
    for index in range(start, start + num_images):
        yield make_example(index, image_size=image_size, min_objects=min_objects,
                           max_objects=max_objects, captions_per_image=captions_per_image,
                           seed=seed, noise=noise)


def make_example(index: int, image_size: int = 64, min_objects: int = 3,
                 max_objects: int = 8, captions_per_image: int = 5, seed: int = 0,
                 noise: float = 4.0) -> RawExample:
    """Image `index` of the stream `seed` (see `generate`)."""
    rng = _rng(seed, index)
    scene = make_scene(rng, image_size, min_objects, max_objects, noise)
    captions = grammar.make_captions(scene.objects, scene.background, captions_per_image, rng)
    buffer = io.BytesIO()
    # Level 1: textures and noise make higher levels slow for a few % smaller files.
    Image.fromarray(scene.image).save(buffer, format="PNG", compress_level=1)
    ordered = sorted(scene.objects, key=lambda o: -o["visible_area"])
    return RawExample(image_id=f"scenes-{index:06d}", image_bytes=buffer.getvalue(),
                      captions=tuple(captions),
                      objects=tuple({"bbox": o["bbox"], "color": o["color"],
                                     "shape": o["shape"], "size": o["size"],
                                     "visible": o["visible"]} for o in ordered))


def scene_at(index: int, image_size: int = 64, min_objects: int = 3, max_objects: int = 8,
             seed: int = 0, noise: float = 4.0) -> Scene:
    """The `Scene` behind image `index` of the stream `seed` (same pixels as `make_example`)."""
    return make_scene(_rng(seed, index), image_size, min_objects, max_objects, noise)


def _rng(seed: int, index: int) -> np.random.Generator:
    # The trailing tag keeps this stream apart from the shapes one of the same seed.
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(index), 2]))


def make_scene(rng: np.random.Generator, image_size: int, min_objects: int,
               max_objects: int, noise: float) -> Scene:
    """Draws the objects, places them, and renders the image.

    Args:
      rng: the image's generator.
      image_size: image side S in pixels.
      min_objects, max_objects: the range of the object count.
      noise: Gaussian pixel noise standard deviation.
    Returns:
      A `Scene`; its objects (draw order) carry `visible_area` (pixels in
      view) and `visible` (that over the object's own pixels).
    """
    s = image_size
    n = int(rng.integers(min_objects, max_objects + 1))
    keys = _sample_keys(n, rng)
    background = grammar.BACKGROUNDS[int(rng.integers(len(grammar.BACKGROUNDS)))]
    objects, masks, coverages = [], [], []
    for color, kind in keys:
        placed = _place(kind, masks, s, rng)
        if placed is None:
            raise RuntimeError(f"could not place {n} objects at {s} px")  # not reached for n <= 8
        size, bbox, mask, coverage = placed
        objects.append({"bbox": bbox, "color": color, "shape": kind, "size": size})
        masks.append(mask)
        coverages.append(coverage)
    owner = np.full((s, s), -1, np.int32)
    for j, mask in enumerate(masks):
        owner[mask] = j
    for j, obj in enumerate(objects):
        visible = int((owner == j).sum())
        obj["visible_area"] = visible
        obj["visible"] = round(visible / int(masks[j].sum()), 3)
    image = _background(background, s, rng)
    _clutter(image, rng)
    for obj, (r0, c0, alpha) in zip(objects, coverages, strict=True):
        base = np.array(grammar.COLORS[obj["color"]], np.float32)
        color = np.clip(base + rng.uniform(-COLOR_JITTER, COLOR_JITTER, 3), 0, 255)
        h, w = alpha.shape
        patch = image[r0:r0 + h, c0:c0 + w]
        image[r0:r0 + h, c0:c0 + w] = patch * (1 - alpha[..., None]) + color * alpha[..., None]
    if noise > 0:
        image += rng.normal(0.0, noise, image.shape).astype(np.float32)
    image = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    return Scene(image, owner, objects, background)


def _sample_keys(n: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    """(color, kind) per object, in draw order; maybe one repeated group."""
    pairs = [(c, k) for c in grammar.COLORS for k in grammar.KINDS]
    group = 1
    if n >= 2 and rng.random() < GROUP_PROB:
        group = int(rng.integers(2, min(3, n) + 1))
    chosen = rng.choice(len(pairs), size=n - group + 1, replace=False)
    keys = [pairs[chosen[0]]] * group + [pairs[k] for k in chosen[1:]]
    return [keys[k] for k in rng.permutation(n)]


def _place(kind: str, masks: list, s: int, rng: np.random.Generator):
    """A size and box for a new object on top of `masks` that hides no earlier one too much.

    Returns ``(size, bbox, pixel mask, (row0, col0, coverage patch))`` or None.
    """
    names = list(grammar.SIZES)
    size = names[int(rng.choice(len(names), p=SIZE_PROBS))]
    covered = np.zeros((s, s), bool)
    keep = []  # per earlier object: pixels in view now
    for j in range(len(masks) - 1, -1, -1):
        keep.append(masks[j] & ~covered)
        covered |= masks[j]
    keep.reverse()
    # Pixels each earlier object may still lose and stay visible enough.
    spare = [int(k.sum()) - max(MIN_PIXELS, MIN_VISIBLE * int(m.sum()))
             for k, m in zip(keep, masks, strict=True)]
    for attempt in range(_TRIES):
        if attempt == _TRIES // 2:
            size = "small"  # crowded: fall back to a small object
        side = rng.uniform(*grammar.SIZES[size])
        lo, hi = EDGE + side / 2, 1 - EDGE - side / 2
        cy, cx = rng.uniform(lo, hi), rng.uniform(lo, hi)
        half = side / 2
        bbox = tuple(round(float(v), 6) for v in (cy - half, cx - half, cy + half, cx + half))
        r0, c0, alpha = coverage(kind, bbox, s)
        window = alpha >= 0.5
        if int(window.sum()) < MIN_PIXELS:
            continue
        rows, cols = slice(r0, r0 + window.shape[0]), slice(c0, c0 + window.shape[1])
        if all(int((k[rows, cols] & window).sum()) <= room for k, room in zip(keep, spare, strict=True)):
            mask = np.zeros((s, s), bool)
            mask[rows, cols] = window
            return size, bbox, mask, (r0, c0, alpha)
    return None


def coverage(kind: str, bbox, s: int) -> tuple[int, int, np.ndarray]:
    """Antialiased coverage of one object on an S x S image.

    Args:
      kind: one of `scenes_grammar.KINDS`.
      bbox: its normalized ``(ymin, xmin, ymax, xmax)`` box.
      s: the image side in pixels.
    Returns:
      ``(row0, col0, patch)``: the patch's top-left pixel and the (h, w)
      fraction of each pixel the object covers (`SUPERSAMPLE`^2 samples).
    """
    f = SUPERSAMPLE
    ymin, xmin, ymax, xmax = bbox
    r0, r1 = max(0, int(np.floor(ymin * s)) - 1), min(s, int(np.ceil(ymax * s)) + 1)
    c0, c1 = max(0, int(np.floor(xmin * s)) - 1), min(s, int(np.ceil(xmax * s)) + 1)
    ys = (r0 + (np.arange((r1 - r0) * f) + 0.5) / f) / s
    xs = (c0 + (np.arange((c1 - c0) * f) + 0.5) / f) / s
    mask = shape_mask(kind, ys[:, None], xs[None, :], bbox)
    return r0, c0, mask.reshape(r1 - r0, f, c1 - c0, f).mean(axis=(1, 3))


def shape_mask(kind: str, y: np.ndarray, x: np.ndarray, bbox) -> np.ndarray:
    """Float mask (broadcast of y, x) of an object of `kind` filling its box.

    circle, square, triangle, cross as in the shapes data; star: a
    five-pointed star, apex up; diamond: the box's inscribed rhombus; ring:
    the disc less a `RING_INNER` hole; heart: the curve
    ``(x^2 + y^2 - 1)^3 <= x^2 y^3`` stretched to the box.

    Args:
      kind: one of `scenes_grammar.KINDS`.
      y, x: normalized coordinates of the sample points (broadcastable).
      bbox: the object's ``(ymin, xmin, ymax, xmax)`` box.
    Returns:
      A float32 array of 0/1, the broadcast shape of y and x.
    """
    ymin, xmin, ymax, xmax = bbox
    cy, cx = (ymin + ymax) / 2, (xmin + xmax) / 2
    hy, hx = (ymax - ymin) / 2, (xmax - xmin) / 2
    u, v = (x - cx) / hx, (y - cy) / hy  # box mapped to [-1, 1]^2, v down
    inside = (np.abs(u) <= 1) & (np.abs(v) <= 1)
    if kind == "circle":
        m = u ** 2 + v ** 2 <= 1
    elif kind == "square":
        m = inside
    elif kind == "triangle":
        m = inside & (np.abs(u) <= (v + 1) / 2)
    elif kind == "cross":
        t = CROSS_THICKNESS
        m = inside & ((np.abs(u) <= t) | (np.abs(v) <= t))
    elif kind == "diamond":
        m = np.abs(u) + np.abs(v) <= 1
    elif kind == "ring":
        r2 = u ** 2 + v ** 2
        m = (r2 <= 1) & (r2 >= RING_INNER ** 2)
    elif kind == "star":
        m = _star(u, v)
    elif kind == "heart":
        hx_, hy_ = 1.14 * u, 0.115 - 1.115 * v  # the curve spans x in +-1.14, y in [-1, 1.23]
        m = inside & ((hx_ ** 2 + hy_ ** 2 - 1) ** 3 - hx_ ** 2 * hy_ ** 3 <= 0)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return m.astype(np.float32)


def _star(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Five-pointed star of outer radius 1, apex up, centred a little low to fill the box."""
    v = v - 0.095  # the star spans v in [-1, 0.81] around its centre: centre it in the box
    u, v = np.broadcast_arrays(u, v)
    r = np.hypot(u, v)
    theta = np.arctan2(u, -v)  # 0 at the apex
    sector = 2 * np.pi / 5
    phi = np.abs((theta + sector / 2) % sector - sector / 2)  # angle from the nearest point
    x, y = r * np.cos(phi), r * np.sin(phi)
    # Inside when on the centre's side of the edge from the tip (1, 0) to the
    # inner vertex at angle sector / 2.
    px, py = STAR_INNER * np.cos(sector / 2), STAR_INNER * np.sin(sector / 2)
    ex, ey = px - 1.0, py
    return ex * y - ey * (x - 1.0) >= 0


def _background(kind: str, s: int, rng: np.random.Generator) -> np.ndarray:
    """A dark, desaturated texture: (S, S, 3) float32."""
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
    lo, hi = rng.uniform(12, 40), rng.uniform(60, 100)
    if kind == "dark":
        gray = np.full((s, s), lo, np.float32)
    elif kind == "striped":
        angle = rng.uniform(0, np.pi)
        period = rng.uniform(4, 10)
        t = (xx * np.cos(angle) + yy * np.sin(angle)) / period
        gray = np.where((t % 1.0) < 0.5, lo, hi)
    elif kind == "checkered":
        cell = rng.uniform(4, 9)
        gray = np.where(((yy // cell + xx // cell) % 2) == 0, lo, hi)
    elif kind == "spotted":
        gray = np.full((s, s), lo, np.float32)
        for _ in range(int(rng.integers(8, 16))):
            y0, x0 = rng.uniform(0, s, 2)
            radius = rng.uniform(2, 6) * s / 64
            gray = np.maximum(gray, hi * (((yy - y0) ** 2 + (xx - x0) ** 2) <= radius ** 2))
    elif kind == "shaded":
        angle = rng.uniform(0, 2 * np.pi)
        t = (xx * np.cos(angle) + yy * np.sin(angle)) / s
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
        gray = lo + (hi - lo) * t
    else:
        raise ValueError(f"unknown background {kind!r}")
    tint = 1 + rng.uniform(-0.15, 0.15, 3).astype(np.float32)
    return (gray[..., None] * tint).astype(np.float32)


def _clutter(image: np.ndarray, rng: np.random.Generator) -> None:
    """Thin gray line segments and specks, drawn under the objects."""
    s = image.shape[0]
    for _ in range(int(rng.integers(3, 9))):
        level = rng.uniform(70, 140) * (1 + rng.uniform(-0.1, 0.1, 3))
        y0, x0 = rng.uniform(0, s, 2)
        length = rng.uniform(0.1, 0.3) * s
        angle = rng.uniform(0, 2 * np.pi)
        t = np.linspace(0, length, int(2 * length) + 1)
        rows = np.clip((y0 + t * np.sin(angle)).astype(int), 0, s - 1)
        cols = np.clip((x0 + t * np.cos(angle)).astype(int), 0, s - 1)
        image[rows, cols] = level
    for _ in range(int(rng.integers(4, 12))):
        r, c = rng.integers(0, s - 1, 2)
        image[r:r + 2, c:c + 2] = rng.uniform(70, 140)
