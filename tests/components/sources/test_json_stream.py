"""json_stream: caption JSON read one item at a time, same items as json.load, bounded memory."""
from __future__ import annotations

import json
import tracemalloc

from components.example_gen.sources import json_stream


def _karpathy_like(n: int) -> dict:
    return {"dataset": "coco", "images": [
        {"filepath": "train2014", "filename": f"img-{i}.jpg", "cocoid": i, "split": "train",
         "sentences": [{"tokens": ["a", "dog", str(k)], "raw": f"A dog {k}.", "sentid": 5 * i + k}
                       for k in range(5)]} for i in range(n)]}


def test_items_equal_json_load_and_count(tmp_path):
    data = _karpathy_like(30)
    data["images"][3]["score"] = 0.25  # floats stay floats
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    assert list(json_stream.iter_items(str(path), "images.item")) == data["images"]
    assert json_stream.count_items(str(path), "images.item") == 30
    assert json_stream.count_items(str(path), "annotations.item") == 0


def test_streaming_holds_one_item_not_the_file(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(_karpathy_like(20000)))  # ~4 MB of JSON

    def peak(fn) -> int:
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    def load_all():
        with open(path) as f:
            return len(json.load(f)["images"])

    def stream():
        return sum(1 for _ in json_stream.iter_items(str(path), "images.item"))

    whole, streamed = peak(load_all), peak(stream)
    assert streamed * 20 < whole, (streamed, whole)
