"""Where preferences come from: a labelling page for people (issue #34).

    store.py     the folder's judgements: an fsync'd append-only log, the preferences file rewritten
                 atomically from it, replay (resume, undo) and agreement between labellers
    pairs.py     the pairs files (language-model and segment pairs), the labelling folder, and judgements →
                 preference rows in the format the trainers read
    app.py       the page: a Starlette app over a labelling folder (``page.html``), served by uvicorn
    sample.py    language-model pairs: two samples per prompt from a model folder (imports `postrl.lm`)
    segments.py  Gymnasium pairs: two segments rendered as clips (imports `postrl.control`)
    commands.py  ``postrl label``

``control`` and ``lm`` never meet here either: only `sample.py` imports `postrl.lm` and only `segments.py`
imports `postrl.control`, each when its kind of pairs is made.
"""
