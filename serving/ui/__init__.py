"""The attention explorer: a static page (`index.html`, `app.js`, `style.css`) and its routes.

`routes` answers `/ui/` on the REST port (`captioner serve --ui`). Imports
`serving.errors` and `serving.signature`.
"""
