"""The paper configs build the paper's encoder: VGG19 `block5_conv4`, a 14x14x512 annotation grid."""
import pytest

from pipeline import config as config_lib


@pytest.mark.parametrize("name", ["coco_paper", "flickr8k"])
def test_paper_configs_give_the_papers_annotation_grid(name):
    from models.encoder import build_encoder
    # ImageNet weights download at run time; the grid's shape does not depend on them.
    cfg = config_lib.load_config(name, ["encoder.weights=none"]).encoder
    assert cfg.kind == "keras_app" and not cfg.coord_channels
    encoder = build_encoder(cfg.kind, application=cfg.application, layer=cfg.layer,
                            weights=cfg.weights, image_size=cfg.image_size,
                            coord_channels=cfg.coord_channels)
    assert tuple(encoder.output_shape) == (None, 14, 14, 512)   # L = 196 regions, D = 512
    assert encoder.get_layer("vgg19_block5_conv4").get_layer("normalize").mode == "caffe"
