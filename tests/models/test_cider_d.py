"""CIDEr-D in the graph agrees with coco-caption's scorer (pycocoevalcap) to float precision."""
import numpy as np
import pytest
import tensorflow as tf
from pycocoevalcap.cider.cider_scorer import CiderScorer

from models.cider_d import CiderD, ngram_keys, ngram_keys_numpy, words_mask
from models.text import END_ID, PAD_ID, START_ID

VOCAB = 12          # ids 4..11 are words
WORDS = [f"w{i}" for i in range(VOCAB)]


def _random_caption(rng, low=1, high=9):
    return list(rng.integers(4, VOCAB, size=rng.integers(low, high)))


def _padded(rows, width, start=False):
    out = np.full((len(rows), width), PAD_ID, np.int32)
    for i, r in enumerate(rows):
        ids = ([START_ID] if start else []) + list(r) + [END_ID]
        out[i, :len(ids)] = ids
    return out


def _coco_scores(candidates, references):
    """pycocoevalcap's CIDEr-D of each candidate (one list per image) against its references."""
    scorer = CiderScorer(n=4, sigma=6.0)
    for cand, refs in zip(candidates, references, strict=True):
        scorer += (" ".join(WORDS[i] for i in cand), [" ".join(WORDS[i] for i in r) for r in refs])
    _, scores = scorer.compute_score()
    return np.asarray(scores)


def test_matches_pycocoevalcap_on_random_captions():
    rng = np.random.default_rng(0)
    images, k, refs_per_image = 12, 3, 4
    references = [[_random_caption(rng) for _ in range(rng.integers(1, refs_per_image + 1))]
                  for _ in range(images)]
    # Candidates: random, a copy of a reference, and a reference with a word changed.
    candidates = []
    for refs in references:
        near = list(refs[0])
        near[0] = 4 + (near[0] - 3) % (VOCAB - 4)
        candidates.append([_random_caption(rng), list(refs[0]), near])
    scorer = CiderD.from_references(references, VOCAB)
    ref_tensor = np.zeros((images, refs_per_image, 12), np.int32)   # missing refs: all pad
    for i, refs in enumerate(references):
        ref_tensor[i, :len(refs)] = _padded(refs, 12, start=True)
    cand_tensor = np.stack([_padded(c, 12) for c in candidates])             # (images, k, 12)
    ours = scorer(cand_tensor, ref_tensor).numpy()
    assert ours.shape == (images, k)
    for j in range(k):
        expected = _coco_scores([c[j] for c in candidates], references)
        np.testing.assert_allclose(ours[:, j], expected, rtol=2e-5, atol=2e-5)
    # The copied reference scores well above the random caption.
    assert (ours[:, 1] > ours[:, 0]).all()


def test_repeated_ngrams_are_clipped_by_the_reference_counts():
    references = [[[4, 5, 6]], [[7, 8]], [[9, 10, 11, 4]]]
    scorer = CiderD.from_references(references, VOCAB)
    refs = np.stack([_padded(r, 6, start=True) for r in references])
    cands = [[4, 4, 4, 5, 6], [7, 8, 7, 8], [9]]
    ours = scorer(np.stack([_padded([c], 7) for c in cands]), refs).numpy()[:, 0]
    np.testing.assert_allclose(ours, _coco_scores(cands, references), rtol=2e-5, atol=2e-5)


def test_words_end_at_the_first_end_token_and_skip_pad_and_start():
    tokens = np.array([[START_ID, 5, 6, END_ID, 7, PAD_ID], [5, END_ID, PAD_ID, 8, 9, 10]])
    np.testing.assert_array_equal(words_mask(tokens).numpy(),
                                  [[0, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])


def test_graph_keys_equal_numpy_keys_and_orders_never_collide():
    words = [4, 5, 6, 7, 11]
    tokens = np.array([[START_ID] + words + [END_ID, PAD_ID]])
    seen = set()
    for order in range(1, 5):
        keys, valid = ngram_keys(tokens, order, VOCAB)
        graph = keys.numpy()[0][valid.numpy()[0]]
        np.testing.assert_array_equal(graph, ngram_keys_numpy(words, order, VOCAB))
        assert not seen & set(graph.tolist())
        seen |= set(graph.tolist())


def test_an_image_without_references_scores_zero_and_empty_candidates_score_zero():
    scorer = CiderD.from_references([[[4, 5]], [[6, 7]]], VOCAB)
    refs = np.stack([_padded([[4, 5]], 4, start=True), np.zeros((1, 4), np.int32)])
    cands = np.stack([_padded([[]], 4), _padded([[6, 7]], 4)])
    np.testing.assert_array_equal(scorer(cands, refs).numpy(), [[0.0], [0.0]])


def test_traces_in_a_function_with_unknown_shapes():
    scorer = CiderD.from_references([[[4, 5, 6]], [[7, 8, 9]]], VOCAB)
    spec = tf.TensorSpec([None, None, None], tf.int32)

    @tf.function(input_signature=[spec, spec], autograph=False)
    def score(c, r):
        return scorer(c, r)

    refs = np.stack([_padded([[4, 5, 6]], 5, start=True), _padded([[7, 8, 9]], 5, start=True)])
    out = score(np.stack([_padded([[4, 5, 6]], 5), _padded([[4, 5, 6]], 5)]), refs).numpy()
    eager = scorer(np.stack([_padded([[4, 5, 6]], 5), _padded([[4, 5, 6]], 5)]), refs).numpy()
    np.testing.assert_allclose(out, eager)
    assert out[0, 0] > 0 and out[1, 0] == 0


def test_vocabularies_too_large_for_int64_keys_are_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        CiderD.from_references([[[4]]], 100_000)
