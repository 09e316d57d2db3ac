"""No client fault escapes as 500 / INTERNAL: REST JSON that cannot be a valid request is 400.

Known cases first (each was a 500 before: a string nested 65 lists deep, the
integer 10^400 as a float, a lone UTF-16 surrogate as a string), then
generated JSON documents (Hypothesis, derandomized) sent as `:predict`
bodies to both signatures: every answer must be 200 or a 4xx with a JSON
`error`, and the server must keep answering.
"""
from __future__ import annotations

import collections
import json

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.serving.conftest import RED, make_base, start_server  # noqa: F401  (fixtures)
from tests.serving.fixtures import b64, expected_caption, rest_call, solid_image

PREDICT = "/v1/models/captioner:predict"
FUZZ = settings(deadline=None, derandomize=True, database=None, max_examples=300,
                phases=(Phase.explicit, Phase.generate), print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


def nested(value, depth: int):
    for _ in range(depth):
        value = [value]
    return value


KNOWN = [  # (body, fragment of the error)
    ({"instances": nested("x", 65)}, "at most 64 dimensions"),
    ({"instances": nested("x", 300)}, "at most 64 dimensions"),
    ({"signature_name": "caption_annotations", "inputs": nested(1.0, 70)},
     "at most 64 dimensions"),
    ({"signature_name": "caption_annotations", "inputs": [[[10 ** 400, 0, 0]]]},
     "out of range for float32"),
    ({"signature_name": "caption_annotations", "inputs": [[[-(10 ** 400), 0, 0]]]},
     "out of range for float32"),
    ({"instances": ["\ud800"]}, "unpaired surrogate"),
    ({"inputs": {"image_bytes": ["\udfff abc"]}}, "unpaired surrogate"),
]


@pytest.fixture
def server(make_base, start_server):  # noqa: F811
    return start_server(make_base({1: "image"}))


@pytest.mark.parametrize("body,fragment", KNOWN, ids=[f"case{i}" for i in range(len(KNOWN))])
def test_known_client_faults_are_400(server, body, fragment):
    raw = json.dumps(body).encode()  # json.dumps keeps a lone surrogate as \ud800
    status, answer = rest_call(server.rest_url, PREDICT, raw=raw)
    assert status == 400, answer
    assert fragment in answer["error"]


JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-(10 ** 400), 10 ** 400),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                        st.just({"b64": "AAAA"}), st.just({"b64": "!!"}),
                        st.just(b64(solid_image(RED))))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda children: st.one_of(
    st.lists(children, max_size=4),
    st.dictionaries(st.sampled_from(["b64", "image_bytes", "annotations", "x"]), children,
                    max_size=3)), max_leaves=20)
DOCUMENTS = st.one_of(
    st.fixed_dictionaries({"instances": st.lists(JSON_LEAVES, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"signature_name": st.just("caption_annotations"),
                           "inputs": st.lists(st.lists(st.lists(
                               st.one_of(st.floats(), st.integers(-(10 ** 400), 10 ** 400)),
                               min_size=3, max_size=3), min_size=1, max_size=2),
                               min_size=1, max_size=2)}),
    st.fixed_dictionaries(
    {}, optional={"instances": JSON_VALUES, "inputs": JSON_VALUES,
                  "signature_name": st.sampled_from(["", "serving_default",
                                                     "caption_annotations", "nope"])}))


def test_generated_json_never_gets_a_500(server):
    codes = collections.Counter()

    @FUZZ
    @given(doc=DOCUMENTS)
    def fuzz(doc):
        status, answer = rest_call(server.rest_url, PREDICT, raw=json.dumps(doc).encode())
        codes[status] += 1
        assert status == 200 or 400 <= status < 500, (doc, status, answer)
        if status != 200:
            assert isinstance(answer.get("error"), str), answer

    fuzz()
    status, answer = rest_call(server.rest_url, PREDICT, {"instances": [b64(solid_image(RED))]})
    assert status == 200 and answer["predictions"][0]["caption"] == expected_caption(RED)
    print(f"\nREST generated JSON: {sum(codes.values())} requests, codes {dict(codes)}")
