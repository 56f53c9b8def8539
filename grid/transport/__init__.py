"""How bytes move between Grid's processes, apart from what they mean.

* :mod:`grid.transport.h1` - the HTTP/1.1 connection pool the gateway and the agent use to
  reach llama.cpp engines.
"""
