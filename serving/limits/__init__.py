"""Request limits: what a request may cost before the server does the work.

Image headers read without decoding (`image_headers`), the decode work an
image needs (`decode_work`), and the two admissions that bound memory
(`admission`) and CPU (`work_admission`) across requests in progress, and
load shedding by deadline (`load_shedding`: refuse at once what would be
answered too late). Imports only `serving.errors`.
"""
