"""yobx as a backend of other libraries' export machinery.

Each module here imports the library it plugs into, so none is imported by ``yobx``
itself: import the one you use.

* :mod:`yobx.integrations.transformers`: an exporter of ``transformers.exporters``
  (``export_format="yobx"``), registered on import with transformers' own ONNX runner.
"""
