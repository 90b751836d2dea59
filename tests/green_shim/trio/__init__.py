"""Stands in for trio in green-pool workers of the tests, and fails to import as a missing module does.

The test extra carries trio (selenium, for the console's browser tests, needs it), and trio cannot be
imported under eventlet's patching: it reads `socket.sendmsg`, which eventlet's green socket lacks, and
raises AttributeError, which httpcore's optional `import trio` does not catch. A user's eventlet worker
without trio loads pydantic-ai; this makes the tests' worker see the same environment, so what a test of
a green pool sees is the package's refusal (FL-10), not trio's failure.
"""

raise ImportError('trio is hidden from the green-pool worker of the tests (tests/green_shim)')
