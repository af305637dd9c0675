"""The figures of chapters 4 to 6, one module per chapter, drawn in the book's style.

Like the figure text (:mod:`posenc.lab.labels`) and the exercise checkers
(:mod:`posenc.lab.exercises`), each chapter's plotting code is a module ``chNN``, imported by
the chapter it draws for::

    from posenc.lab.figures import ch05 as figs
    fig = figs.log_weights(log_w, slopes, L_train, text)

The other chapters draw their few figures in their own cells (folded in the HTML).
"""
