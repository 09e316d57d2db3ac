"""Argument checks shared by the built-in synthetic generators (shapes and scenes)."""
import pytest

from components.synthetic import scenes
from components.synthetic import shapes as synthetic

BAD = {
    synthetic: [dict(min_objects=0), dict(max_objects=4), dict(min_objects=3, max_objects=2),
                dict(image_size=8), dict(captions_per_image=0)],
    scenes: [dict(min_objects=0), dict(max_objects=9), dict(min_objects=4, max_objects=3),
             dict(image_size=16), dict(captions_per_image=0)],
}


@pytest.mark.parametrize("generator,kwargs", [(g, k) for g, cases in BAD.items() for k in cases],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_bad_arguments_are_rejected(generator, kwargs):
    with pytest.raises(ValueError):
        next(generator.generate(1, **kwargs))
