"""The papers' experiments and the privacy audits, outside the importable core.

One ``FAMILY_recipe`` module per paper (``ldp-beam reproduce FAMILY`` or
``python -m ldp_beam.reproduce.FAMILY_recipe``), ``audit_recipe`` (``ldp-beam audit``), their data
(:mod:`.datasets`), metrics (:mod:`.metrics`), the RVNS adversary (:mod:`.adversary`) and the
report of every claim (:mod:`.report`). The core never imports it; the command line
(``ldp_beam.pipelines``) does, for ``reproduce`` and ``audit``, the demo's figures and range-query
error, and the bench's chi-squared data. It imports matplotlib only where a figure is drawn
(:func:`.recipe.pyplot`): figures need the ``reproduce`` extra (``pip install
'ldp-beam[reproduce]'``), everything else here runs without it.
"""
