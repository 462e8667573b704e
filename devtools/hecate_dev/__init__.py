"""The developer tools beside the product: benchmarks (:mod:`hecate_dev.bench`) and
chaos scenarios (:mod:`hecate_dev.chaos`), one package so that each may use the other
(the report has a chaos section; chaos borrows the benchmarks' provenance and plots).
Nothing in the product imports it: ``hecate`` finds its commands through the
``hecate.cli`` entry-point group (see ``devtools/pyproject.toml``)."""
