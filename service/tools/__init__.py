"""Stand-alone tools the launcher and the tests share (each runnable with ``python -m``).

* :mod:`tenure.service.tools.tiny_model` - writes the tiny random-weight Llama checkpoint the local
  stack (``tenure up``) and the engine tests serve, with no download.
"""
